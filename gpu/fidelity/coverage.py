"""What of the fake's surface the fidelity script compares with real SGLang, and what it does not.

The surface of a release is every route the fake serves there (its route table, ``fakes.app.HANDLERS``, as the
release's snapshot has it) and every field of the body struct each takes (``fakes.structs``) that the fake acts on
(not in ``fakes.app.IGNORED_FIELDS``, the fields it validates and, like SGLang on CPU or by design, leaves
alone). A route no step calls,
or a field no step sends to it, is *uncovered*: the fake's behaviour there was never judged against the engine. Each
must be compared or listed, with its reason, in ``uncovered.json`` (``{"route", "fields"?, "why"}``; a route of
``"*"`` names fields of every struct, an entry without ``fields`` the route itself). ``python -m gpu.fidelity
--coverage`` runs the script on the fake alone and prints both; a test holds them equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from fakes.app import HANDLERS, IGNORED_FIELDS
from fakes.structs import endpoints, struct_fields

from .script import Sent

UNCOVERED = Path(__file__).resolve().parent / "uncovered.json"

Item = tuple[str, str | None]
"""An uncovered route (``(route, None)``) or field (``(route, field)``)."""


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
    """What of ``release``'s surface none of ``sent`` exercised."""
    return uncovered_in(surface(release), sent)


def uncovered_in(routes: dict[str, frozenset[str]], sent: Iterable[Sent]) -> list[Item]:
    """What of ``routes`` (route → the body fields the fake acts on) none of ``sent`` exercised: any family's."""
    called: dict[str, set[str]] = {}
    for _method, path, fields in sent:
        route = _route_of(path, routes)
        if route is not None:
            called.setdefault(route, set()).update(fields)
    found: list[Item] = []
    for route, fields in routes.items():
        if route not in called:
            found.append((route, None))
        found += [(route, f) for f in sorted(fields - called.get(route, set()))]
    return found


@dataclass(frozen=True)
class Listed:
    """One entry of ``uncovered.json``."""

    route: str
    fields: tuple[str, ...] | None
    why: str

    def explains(self, item: Item) -> bool:
        route, field = item
        if field is None:
            return self.fields is None and self.route == route
        return self.fields is not None and field in self.fields and self.route in ("*", route)


def listed(path: Path = UNCOVERED) -> list[Listed]:
    """The committed list."""
    entries: list[dict[str, Any]] = json.loads(path.read_text())["uncovered"]
    return [Listed(e["route"], tuple(e["fields"]) if "fields" in e else None, e["why"]) for e in entries]


def judge(found: dict[str, list[Item]], entries: list[Listed]) -> tuple[list[tuple[str, Item]], list[str]]:
    """Uncovered items (per release) no entry explains, and the listed routes or fields that are uncovered on no
    release (compared now, or gone: remove them)."""
    unexplained = [(release, item) for release, items in found.items() for item in items
                   if not any(e.explains(item) for e in entries)]
    everywhere = [item for items in found.values() for item in items]
    stale = []
    for entry in entries:
        names = [None] if entry.fields is None else list(entry.fields)
        stale += [f"{entry.route} {name or '(the route)'}" for name in names
                  if not any(entry.explains(item) and item[1] == name for item in everywhere)]
    return unexplained, stale


def report(found: dict[str, list[Item]], entries: list[Listed], family: str = "sglang",
           surface_of: Callable[[str], dict[str, frozenset[str]]] = surface,
           list_path: Path = UNCOVERED) -> tuple[str, bool]:
    """The coverage report's text for ``family`` (its releases' surfaces by ``surface_of``, its list at
    ``list_path``), and whether it holds (every uncovered item explained, nothing stale)."""
    unexplained, stale = judge(found, entries)
    lines = []
    for release, items in found.items():
        routes = sum(1 for _, f in items if f is None)
        lines.append(f"{family} {release}: {len(surface_of(release))} routes served, {routes} uncovered route(s), "
                     f"{len(items) - routes} uncovered field(s)")
    for entry in entries:
        what = "the route" if entry.fields is None else ", ".join(entry.fields)
        lines.append(f"  listed  {entry.route}: {what} — {entry.why}")
    for release, (route, field) in unexplained:
        lines.append(f"  UNCOMPARED {release} {route} {field or '(the route)'}: compare it, or list it with its "
                     f"reason in {list_path.name}")
    lines += [f"  STALE   {name}: compared on every release now; remove it from {list_path.name}" for name in stale]
    return "\n".join(lines), not unexplained and not stale
