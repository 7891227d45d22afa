"""What of the fake's surface the fidelity script compares with real SGLang, and what it does not.

The surface of a release is every route the fake serves there (its route table, ``fakes.app.HANDLERS``, as the
release's snapshot has it), every field of the body struct each takes (``fakes.structs``) that the fake acts on
(not in ``fakes.app.IGNORED_FIELDS``, the fields it validates and, like SGLang on CPU or by design, leaves
alone), and every engine state each is called in (``gpu.fidelity.matrix.states``: idle, a request decoding, paused
in each mode, inside a weight-update session). A route no step calls, a field no step sends to it, or a state no
step of the state matrix calls it from, is *uncovered*: the fake's behaviour there was never judged against the
engine. Each must be compared or listed, with its reason, in ``uncovered.json`` (``{"route", "fields"? |
"states"?, "why"}``; a route of ``"*"`` names fields of every struct, a state of ``"*"`` every state, an entry with
neither the route itself). ``python -m gpu.fidelity --coverage`` runs the script on the fake alone and prints both;
a test holds them equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from fakes.app import HANDLERS, IGNORED_FIELDS
from fakes.structs import endpoints, struct_fields

from .script import Sent

UNCOVERED = Path(__file__).resolve().parent / "uncovered.json"

Item = tuple[str, str | None] | tuple[str, None, str]
"""An uncovered route (``(route, None)``), field (``(route, field)``) or state (``(route, None, state)``)."""


def surface(release: str) -> dict[str, frozenset[str]]:
    """The routes the fake serves on ``release``, each with the fields of its body struct it acts on."""
    served = endpoints(release)
    routes = {}
    for path in HANDLERS:
        endpoint = served.get(path)
        if endpoint is not None:
            struct = endpoint.get("struct")
            fields = frozenset(struct_fields(struct, release)) if struct else frozenset()
            routes[path] = fields - IGNORED_FIELDS.get(struct, frozenset())
    return routes


def _route_of(path: str, routes: Iterable[str]) -> str | None:
    """The route ``path`` was served by (``/v1/models/x`` by ``/v1/models/{model:path}``)."""
    for route in routes:
        if route == path or ("{" in route and path.startswith(route[:route.index("{")]) and
                             len(path) > route.index("{")):
            return route
    return None


def uncovered(release: str, sent: Iterable[Sent]) -> list[Item]:
    """What of ``release``'s surface (its routes, their fields, the engine states, a malformed body for each route
    that takes a struct) none of ``sent`` exercised."""
    from .malformed import MALFORMED, malformed
    from .matrix import states

    return uncovered_in(surface(release), sent, states(release),
                        {case.route: (MALFORMED,) for case in malformed(release)}, refused=frozenset({MALFORMED}))


def uncovered_in(routes: dict[str, frozenset[str]], sent: Iterable[Sent], states: Iterable[str] = (),
                 more_states: Mapping[str, Iterable[str]] | None = None,
                 refused: frozenset[str] = frozenset()) -> list[Item]:
    """What of ``routes`` (route → the body fields the fake acts on) none of ``sent`` exercised, each route also in
    each of ``states`` and of its ``more_states``: any family's. A request sent in a state of ``refused`` (a body the
    engine refuses before it acts) covers that state only, not its route or fields."""
    called: dict[str, set[str]] = {}
    called_in: dict[str, set[str]] = {}
    for request in sent:
        route = _route_of(request.path, routes)
        if route is not None:
            if request.state not in refused:
                called.setdefault(route, set()).update(request.fields)
            if request.state is not None:
                called_in.setdefault(route, set()).add(request.state)
    found: list[Item] = []
    for route, fields in routes.items():
        if route not in called:
            found.append((route, None))
        found += [(route, f) for f in sorted(fields - called.get(route, set()))]
        found += [(route, None, state) for state in (*states, *(more_states or {}).get(route, ()))
                  if state not in called_in.get(route, set())]
    return found


@dataclass(frozen=True)
class Listed:
    """One entry of ``uncovered.json``."""

    route: str
    fields: tuple[str, ...] | None
    why: str
    states: tuple[str, ...] | None = None

    def explains(self, item: Item) -> bool:
        route, field, state = (*item, None)[:3]
        if state is not None:
            return self.states is not None and (state in self.states or "*" in self.states) and \
                self.route in ("*", route)
        if field is None:
            return self.fields is None and self.states is None and self.route == route
        return self.fields is not None and field in self.fields and self.route in ("*", route)

    def names(self) -> list[str | None]:
        """What the entry lists: its fields, its states, or (None) the route."""
        return list(self.fields or self.states or [None])


def listed(path: Path = UNCOVERED) -> list[Listed]:
    """The committed list."""
    entries: list[dict[str, Any]] = json.loads(path.read_text())["uncovered"]
    return [Listed(e["route"], tuple(e["fields"]) if "fields" in e else None, e["why"],
                   tuple(e["states"]) if "states" in e else None) for e in entries]


def _what(item: Item) -> str:
    """An item's name in the report: its field, its state, or the route."""
    if len(item) == 3:
        return f"in state {item[2]}"
    return item[1] or "(the route)"


def judge(found: dict[str, list[Item]], entries: list[Listed]) -> tuple[list[tuple[str, Item]], list[str]]:
    """Uncovered items (per release) no entry explains, and the listed routes, fields or states that are uncovered
    on no release (compared now, or gone: remove them)."""
    unexplained = [(release, item) for release, items in found.items() for item in items
                   if not any(e.explains(item) for e in entries)]
    everywhere = [item for items in found.values() for item in items]
    stale = []
    for entry in entries:
        for name in entry.names():
            if not any(entry.explains(item) and _names(entry, name, item) for item in everywhere):
                item = (entry.route, None, name) if entry.states else (entry.route, name)
                stale.append(f"{entry.route} {_what(item)}")
    return unexplained, stale


def _names(entry: Listed, name: str | None, item: Item) -> bool:
    """Whether ``name`` of ``entry`` (one of its fields or states, or None: the route) is ``item``."""
    if entry.states is not None:
        return len(item) == 3 and name in ("*", item[2])
    return len(item) == 2 and item[1] == name


def report(found: dict[str, list[Item]], entries: list[Listed], family: str = "sglang",
           surface_of: Callable[[str], dict[str, frozenset[str]]] = surface,
           list_path: Path = UNCOVERED) -> tuple[str, bool]:
    """The coverage report's text for ``family`` (its releases' surfaces by ``surface_of``, its list at
    ``list_path``), and whether it holds (every uncovered item explained, nothing stale)."""
    unexplained, stale = judge(found, entries)
    lines = []
    for release, items in found.items():
        routes = sum(1 for item in items if len(item) == 2 and item[1] is None)
        states = sum(1 for item in items if len(item) == 3)
        lines.append(f"{family} {release}: {len(surface_of(release))} routes served, {routes} uncovered route(s), "
                     f"{len(items) - routes - states} uncovered field(s), {states} uncovered route state(s)")
    for entry in entries:
        what = ", ".join(entry.fields) if entry.fields else \
            "in state " + ", ".join(entry.states) if entry.states else "the route"
        lines.append(f"  listed  {entry.route}: {what} — {entry.why}")
    for release, item in unexplained:
        lines.append(f"  UNCOMPARED {release} {item[0]} {_what(item)}: compare it, or list it with its reason in "
                     f"{list_path.name}")
    lines += [f"  STALE   {name}: compared on every release now; remove it from {list_path.name}" for name in stale]
    return "\n".join(lines), not unexplained and not stale
