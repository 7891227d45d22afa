"""``-m gpu``: the conformance cases on real SGLang engines spread by Ray over ``--conformance-nodes`` nodes.

:class:`GpuSuite` is what the plugin's ``gpu`` backend uses, once per pytest session: it says in one line why the
cases cannot run here (no ``ray``, no ``sglang``, no GPU), else connects to the cluster (``--conformance-ray-address``, else
``RAY_ADDRESS``, else a Ray started on this machine), picks the served model (``--model-path``, else the tiny model
built locally and shipped to every engine's node) and makes one :class:`gpu.backend.RayBackend` per scenario.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakes.profiles import DEFAULT_PROFILE

from .launch import SGLANG, EngineSpec

INSTALL_HINT = "pip install 'weightsync-conformance[gpu]' on the GPU nodes and here"


def missing_software() -> list[str]:
    """What this machine lacks to drive real SGLang on Ray (cheap: nothing is imported)."""
    return [f"{name} is not installed" for name in ("ray", "sglang") if importlib.util.find_spec(name) is None]


def visible_gpus() -> int:
    """GPUs torch sees on this machine (0 with a CPU-only torch)."""
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


@dataclass
class GpuSuite:
    """The ``gpu`` backend of one pytest session."""

    nodes: int = 1
    ray_address: str | None = None
    model_path: str | None = None
    profile: str = DEFAULT_PROFILE
    seed: int = 0
    health_timeout_s: float = 600.0
    _skip: str | None = field(default=None, init=False)
    _checked: bool = field(default=False, init=False)
    _error: str | None = field(default=None, init=False)
    _built: str | None = field(default=None, init=False)
    _start_failure: str | None = field(default=None, init=False)

    def skip_reason(self) -> str | None:
        """Why ``-m gpu`` cannot run here (one line), or None; checked once. Raises RuntimeError (every time) when
        the cluster it was pointed at cannot be used: that is a broken setup, not a machine without GPUs."""
        if not self._checked:
            self._checked = True
            try:
                self._skip = self._check()
            except Exception as exc:
                self._error = f"cannot use the Ray cluster: {type(exc).__name__}: {exc}"
        if self._error:
            raise RuntimeError(self._error)
        return self._skip

    def _check(self) -> str | None:
        address = self.ray_address or os.environ.get("RAY_ADDRESS")
        problems = missing_software()
        if address is None and visible_gpus() == 0:
            problems.append("no GPU is visible here and no Ray cluster was given (--conformance-ray-address or RAY_ADDRESS)")
        if problems:
            return f"-m gpu needs real SGLang on GPUs: {'; '.join(problems)} ({INSTALL_HINT})"
        from .cluster import connect

        connect(address)
        import ray

        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus == 0:
            return f"-m gpu needs real SGLang on GPUs: the Ray cluster at {address or 'this machine'} has no GPU"
        return None

    def model(self) -> tuple[str, dict[str, bytes] | None]:
        """The served model's path and, for the built tiny model, its files to write on every engine's node."""
        if self.model_path:
            return self.model_path, None
        if self._built is None:
            from .tiny_model import write_model

            self._built = str(write_model(Path(tempfile.mkdtemp(prefix="weightsync-tiny-model-")) / "model"))
        return self._built, {p.name: p.read_bytes() for p in Path(self._built).iterdir()}

    def backend_config(self) -> Any:
        """What each scenario's backend starts: ``max(2, nodes)`` engines over ``nodes`` nodes, one GPU each, or
        a share of one when a node holds several (the tiny model fits many times on a GPU)."""
        from .backend import RayBackendConfig

        path, files = self.model()
        engines = max(2, self.nodes)
        per_node = -(-engines // self.nodes)
        spec = EngineSpec(model_path=path, enable_lora=True, random_seed=self.seed,
                          mem_fraction_static=round(0.8 / per_node, 2) if per_node > 1 else None)
        return RayBackendConfig(spec, engines=engines, nodes=self.nodes, program=SGLANG,
                                resources_per_engine={"CPU": 1, "GPU": round(1 / per_node, 4)},
                                health_timeout_s=self.health_timeout_s, profile=self.profile, model_files=files)

    def backend_factory(self) -> Any:
        """A zero-argument factory of fresh backends (one per scenario). Once engines failed to start, later
        scenarios fail at once with that reason instead of waiting out the health deadline again."""
        from .backend import EngineFailure, RayBackend

        config = self.backend_config()
        suite = self

        class SessionBackend(RayBackend):
            def start(self) -> None:
                if suite._start_failure:
                    raise EngineFailure(f"not started: an earlier scenario's engines did not start:\n"
                                        f"{suite._start_failure}")
                try:
                    super().start()
                except EngineFailure as exc:
                    suite._start_failure = str(exc)
                    raise
        return lambda: SessionBackend(config)

    def close(self) -> None:
        if self._built is not None:
            shutil.rmtree(Path(self._built).parent, ignore_errors=True)
        if self._checked and self._skip is None and self._error is None:
            import ray

            ray.shutdown()
