"""Answers held at a pause gate: the integration gets answers while every engine is paused by its cycle, so what it
sends next meets SGLang's pause gate (or its own) and runs entirely under the weights the cycle installs. Built by
holding the answers to its ``/generate`` calls at the wire until every engine is paused (:func:`hold`); shown when
everything it sent into the gate was consumed (:func:`consumed`)."""

from __future__ import annotations

from typing import Callable

from ..history import History, WireCall
from ..wire_control import AnswerHold
from .producer import Producer
from .scene import Scene, turn
from .waiting import wait_for


async def hold(scene: Scene) -> tuple[AnswerHold, Callable[[], None]]:
    """Before a cycle: hold back the answers to the integration's ``/generate`` calls (once one is held) until every
    engine is paused by it, then hand them over; each engine's continue waits (at most two turns) until the
    integration sent that engine a call after that. While no answer is held and none of its calls is open, batches are
    consumed (its producer may be blocked on a full buffer). Returns the hold and the function that stops following
    the wire (once the cycle is over)."""
    backend = scene.backend
    wire, engines = backend.wire, len(backend.urls)
    paused: set[int] = set()
    sent: set[int] = set()  # engines sent a /generate once the answers went on
    decoding: dict[int, int] = {}  # the suite's long-lived requests open: seq -> engine

    def follow(call: WireCall, answered: bool) -> None:
        if call.origin == "sentinel" and call.path == "/generate":
            if answered:
                decoding.pop(call.seq, None)
            else:
                decoding[call.seq] = call.engine
            return
        if call.origin != "integration":
            return
        if call.path == "/pause_generation" and answered and call.ok:
            paused.add(call.engine)
        elif call.path == "/continue_generation":
            paused.discard(call.engine)
        elif call.path == "/generate" and not answered and answers.released_at is not None:
            sent.add(call.engine)
    # a pause that drains before it answers (vLLM's wait, recorded as retract) answers once the suite's long-lived
    # request ended: the bound runs only while no engine left unpaused still decodes one
    answers = backend.control.hold_answers(
        lambda: len(paused) == engines, max(2.0, 4 * turn(scene)),
        waiting=lambda: any(engine not in paused for engine in list(decoding.values())))
    stop = wire.listen(follow)
    producer = Producer(scene)
    await wait_for(lambda: answers.held > 0, scene.deadlines.wait_s, "an answer to one of the integration's /generate "
                   "calls (to hand it over while every engine is paused)", wake=wire.listen,
                   between=lambda: producer.unstall(bool(wire.in_flight())))
    backend.control.hold_first(frozenset({"/continue_generation"}), lambda engine, _: engine in sent, 2 * turn(scene))
    return answers, stop


def record(scene: Scene, answers: AnswerHold, cycle: int) -> None:
    """After the cycle: answers that went on before every engine was paused built nothing (S2 answers unknown)."""
    if answers.released_by != "ready":
        why = "its cycle ended first" if answers.released_by == "end" else f"not within {answers.timeout_s:.1f}s"
        scene.unmet(("S2",), f"update cycle {cycle}: the answers held back from the integration went on before every "
                    f"engine was paused ({why}): what it sends while its engines are paused (SGLang's pause gate "
                    f"holds it) is not shown")


def consumed(history: History) -> bool:
    """Whether every call the integration sent into SGLang's pause gate was consumed, and a group all of whose calls
    were sent after the last cycle's first answered pause (whether held at the gate or sent once the cycle was over)
    was consumed too."""
    taken = {t.rid for rec in history.batches for g in rec.batch.groups for s in g.samples for t in s.turns}
    calls = [(rid, call) for rid, (call, _) in history.outputs_by_rid().items()]
    if any(history.gate_cycle(call) is not None and rid not in taken for rid, call in calls):
        return False
    last = history.cycles[-1]
    pauses = [w.t_end for w in history.cycle_calls(last) if w.path == "/pause_generation" and w.ok
              and w.t_end is not None]
    if not pauses:
        return False
    sent = {rid: call.t_start for rid, call in calls}
    return any(all(sent.get(t.rid, -1.0) >= min(pauses) for s in g.samples for t in s.turns)
               for rec in history.batches for g in rec.batch.groups)
