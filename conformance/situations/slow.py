"""One engine held behind: the last engine is slow at one step of a cycle (its pause, its transfer or adapter load,
its continue), so what the integration does once the other engines are done happens while that engine's call is
still in progress. Built by holding the answer to that engine's first such call until every other engine answered
its own (:func:`hold`); shown by the window the hold kept open (:data:`SITUATION`)."""

from __future__ import annotations

from typing import Callable

from ..history import EVERY_CHECK, LORA_LOAD_PATHS, History, Injected, WireCall
from ..wire_control import AnswerHold
from .refused import TRANSFER_FAILURES
from .scene import Scene, Situation
from .timing import LINGER_S

def _shown(h: History) -> bool:
    return any(i.kind == "window" for i in h.injected)


SITUATION = Situation("window", "window held open on purpose (one engine's call kept in progress while the others "
                      "finished)", _shown)


def hold(scene: Scene, step: str, transport: str, lora: bool) -> tuple[AnswerHold, Callable[[], None]]:
    """Make the last engine slow at ``step`` of the coming cycle: the answer to its first pause, transfer (the
    transport's endpoint, or an adapter load) or continue is held until every other engine answered its own and had
    none open for :data:`~.timing.LINGER_S` (at most a quarter of the update deadline). Returns the hold and the
    function that stops following the wire."""
    if step == "transfer" and transport == "distributed" and not lora:
        raise ValueError("update(slow='transfer'): a distributed transfer is one collective, every engine finishes it "
                         "together")
    paths = {"pause": frozenset({"/pause_generation"}), "continue": frozenset({"/continue_generation"}),
             "transfer": LORA_LOAD_PATHS if lora else frozenset({TRANSFER_FAILURES[transport][0]})}[step]
    wire, slow = scene.backend.wire, len(scene.backend.urls) - 1
    others = set(range(len(scene.backend.urls))) - {slow}
    open_: dict[int, int] = dict.fromkeys(others, 0)
    answered: set[int] = set()
    quiet: list[float | None] = [None]

    def follow(call: WireCall, done: bool) -> None:
        if call.origin == "integration" and call.path in paths and call.engine in others:
            open_[call.engine] += -1 if done else 1
            answered.update([call.engine] if done else [])

    def others_done() -> bool:
        now, done = wire.clock(), answered == others and not any(open_.values())
        quiet[0] = (quiet[0] or now) if done else None
        return quiet[0] is not None and now - quiet[0] >= LINGER_S
    stop = wire.listen(follow)
    answers = scene.backend.control.hold_answers(others_done, scene.deadlines.update_s / 4, paths, engine=slow,
                                                 first_only=True)
    return answers, stop


def record(scene: Scene, window: AnswerHold, step: str, cycle: int) -> None:
    """Record the window :func:`hold` held open, or that it never opened (every check answers unknown; a pause or
    continue the integration never sends is no window to open)."""
    engine, paths = window.engine, " or ".join(sorted(window.paths))
    if window.released_by == "ready" and window.held_at is not None:
        scene.history.injected.append(Injected(
            window.held_at, "window", engine, f"update cycle {cycle}: the answer to engine {engine}'s first {paths} "
            f"was held until every other engine had answered its own (a slow {step})", t_end=window.released_at))
        return
    if not window.held and step != "transfer":  # an integration that never pauses: nothing to be slow at
        return
    why = ("the integration sent it no such call" if not window.held else
           "its cycle ended first" if window.released_by == "end" else
           f"the other engines had not all answered theirs within {window.timeout_s:.1f}s")
    scene.unmet(EVERY_CHECK, f"update cycle {cycle}: engine {engine}'s {paths} was not kept in progress while the "
                f"other engines had finished theirs ({why}): a slow {step} is not shown")
