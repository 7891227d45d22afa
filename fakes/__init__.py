"""fakes: a faithful fake SGLang engine and router for CPU tests (vendorable; see README.md).

Everything public is re-exported lazily (module `__getattr__`), so importing the package imports nothing heavy
(no uvicorn, httpx or torch): `FakeEngine`, `FakeRouter`, `LoopbackServer`, `asgi_client`, `mount_respx`,
`ManualClock`, `RealClock`, `PROFILES`, `FaultPlan`, `Fault`, `WeightStore`, `TensorBlob`, `load_served_model`, ...
The package uses relative imports only, so it can be vendored under any name.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "FakeEngine": "engine",
    "FakeRouter": "router",
    "LoopbackServer": "server",
    "asgi_client": "server",
    "mount_respx": "server",
    "RealRouterProcess": "server",
    "real_router_available": "server",
    "ManualClock": "clock",
    "RealClock": "clock",
    "PROFILES": "profiles",
    "DEFAULT_PROFILE": "profiles",
    "Profile": "profiles",
    "FaultPlan": "faults",
    "Fault": "faults",
    "WeightStore": "weights",
    "ServedModel": "served_model",
    "load_served_model": "served_model",
    "TensorBlob": "weights",
    "EventLog": "events",
    "Event": "events",
    "RequestError": "structs",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
