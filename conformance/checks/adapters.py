"""LoRA adapter lifecycle: P7 (never unload an adapter that paused requests still use)."""

from __future__ import annotations

from ..anomaly import Anomaly
from ..history import LORA_LOAD_PATHS, History
from .registry import check
from .verdict import Verdict, verdict


@check("P7", "adapters not unloaded in use",
       needs={"lora"},
       holds="no adapter is unloaded while paused requests that use it are resident (SGLang's unload waits for "
             "them forever)",
       reads="`/unload_lora_adapter` against the engine's pause windows and the `lora_path` of the `/generate` "
             "calls open then")
def adapter_not_unloaded_in_use(h: History) -> Verdict:
    """P7: an adapter is never unloaded while requests naming it are resident on a paused engine. SGLang's unload
    first waits for every request that uses the adapter, and a paused request never finishes, so the update
    deadlocks (miles #2780: refresh an adapter by loading a new name, or upsert, never unload + load while paused).
    An unload while the engine runs only waits for its users and is fine."""
    failures: list[Anomaly] = []
    unloads = list(h.integration_calls("/unload_lora_adapter"))
    for call in unloads:
        name = call.payload.get("lora_name") if isinstance(call.payload, dict) else None
        pause = h.paused_at(call.engine, call.t_start)
        if name is None or pause is None:
            continue
        users = [w for w in h.resident_at(call.engine, call.t_start)
                 if isinstance(w.payload, dict) and w.payload.get("lora_path") == name]
        if users:
            rids = [w.payload.get("rid") for w in users][:3]
            answer = ("got no answer" + (f" (dropped at t={call.t_end:.3f}s)" if call.t_end is not None else "")
                      if call.status is None else f"answered {call.status} at t={call.t_end:.3f}s")
            failures.append(Anomaly(
                "unload-in-use",
                f"engine {call.engine}: adapter {name!r} was unloaded at t={call.t_start:.3f}s while the "
                f"engine was paused (since t={pause.t_start:.3f}s) with {len(users)} request(s) using it "
                f"resident (e.g. {rids}); SGLang waits for them and a paused request never finishes, so "
                f"the update deadlocks (the unload {answer})",
                engine=call.engine, rids=tuple(str(r) for r in rids), times=(pause.t_start, call.t_start)))
    # a design that never unloads (upserts in place, or loads each version under a new name) cannot unload one in
    # use: with adapters loaded, nothing unloaded is a pass
    loads = [c for c in h.integration_calls() if c.path in LORA_LOAD_PATHS]
    vacuous = None if unloads or loads else "no LoRA adapter was loaded during the run"
    return verdict(failures, vacuous=vacuous, metrics={"unloads": len(unloads), "loads": len(loads)})
