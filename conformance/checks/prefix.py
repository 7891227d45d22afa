"""The prefix cache across weight loads: C3 (no prompt is served KV its engine computed on weights it no longer
holds)."""

from __future__ import annotations

from ..anomaly import Anomaly
from ..history import History
from ..situations.prefix import prefix_hits
from .registry import check
from .verdict import Verdict, verdict


def _rid(call: object) -> str:
    payload = getattr(call, "payload", None)
    return str(payload.get("rid")) if isinstance(payload, dict) and payload.get("rid") is not None else "?"


@check("C3", "no KV of older weights",
       needs={"prefix-after-load"},
       holds="a prompt scheduled after a weight load is never served prefix-cache blocks computed before it: the "
             "cache is reset after the load (a flush, a pause that clears it) or keyed apart (a salt per version)",
       reads="`cached_tokens` of every answer; per engine the weight loads, the cache resets and the first request "
             "of the cache's epoch whose tokens (prompt, salt, adapter) cover the prefix served")
def no_stale_prefix(h: History) -> Verdict:
    """C3: a request scheduled after a weight load on its engine is never served prefix-cache blocks its engine
    computed before that load, with no reset between (NeMo-RL#4018: vLLM keeps its prefix cache across
    ``reload_weights`` and the weight-transfer engine's updates, so the new weights answer over the old ones' KV; a
    pause clears it unless sent with ``clear_cache=false``). Attributed from the wire
    (:func:`conformance.situations.prefix.prefix_hits`): a hit no request on the wire computed, or computed by one
    that may have been scheduled on either side of the load, is not judged."""
    hits = prefix_hits(h)
    failures = []
    for hit in (x for x in hits if x.stale):
        assert hit.computed_by is not None and hit.computed is not None
        call, load, first = hit.call, hit.load, hit.computed_by
        failures.append(Anomaly(
            "stale-prefix",
            f"engine {call.engine}: request {_rid(call)} (sent t={call.t_start:.3f}s, scheduled from "
            f"t={hit.scheduled.earliest:.3f}s) was served {hit.cached} prompt tokens from the prefix cache, computed "
            f"by request {_rid(first)} (scheduled by t={hit.computed.latest:.3f}s) before the weights were loaded "
            f"({load.sent_as or load.path} at t={load.t_start:.3f}s), with no reset of the cache since: the new "
            f"weights answered over the old ones' KV",
            engine=call.engine, rids=(_rid(call), _rid(first)),
            times=(hit.computed.latest, load.t_start, call.t_start)))
    return verdict(failures[:5], metrics={"hits_after_load": len(hits), "decided": sum(x.decided for x in hits),
                                          "stale": len(failures)})
