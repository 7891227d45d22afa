"""``-m gpu``: the conformance cases on real engines spread by Ray over ``--conformance-nodes`` nodes, SGLang or vLLM
(``--conformance-engine``).

:class:`GpuSetup` is what the plugin's ``gpu`` backend uses, once per pytest session: it says in one line why the
cases cannot run here (no ``ray``, no engine package, no GPU), else connects to the cluster
(``--conformance-ray-address``, else ``RAY_ADDRESS``, else a Ray started on this machine), picks the served model
(``--conformance-model-path``, else the tiny model built here and shipped to every engine's node) and lends one
:class:`gpu.pool.EnginePool` of ``max(2, nodes)`` engines in Ray actors (:class:`gpu.backend.RayBackend`: a GPU
each, or a share of one where a node holds several) to every scenario, reset between them.

``simulate=True`` (``--conformance-simulated-cluster``) runs the same command on a simulated cluster of ``nodes``
nodes on this machine (``ray.cluster_utils.Cluster``, one logical GPU a node), the family's drop-in fake as the
engines' program with the same launch line: the cluster path (placement, actors, proxies, resets) without GPUs.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from conformance.families import DEFAULT_FAMILY, FAMILIES
from fakes.profiles import DEFAULT_PROFILE

from .families import RealFamily
from .launch import EngineSpec
from .pool import PooledSetup

INSTALL_HINT = "pip install 'weightsync-conformance[gpu]' on the GPU nodes and here"


def missing_software(*packages: str) -> list[str]:
    """Which of ``packages`` this machine lacks (cheap: nothing is imported)."""
    return [f"{name} is not installed" for name in packages if importlib.util.find_spec(name) is None]


def visible_gpus() -> int:
    """GPUs torch sees on this machine (0 with a CPU-only torch)."""
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


@dataclass
class GpuSetup(PooledSetup):
    """The ``gpu`` backend of one pytest session."""

    nodes: int = 1
    ray_address: str | None = None
    model_path: str | None = None
    profile: str = DEFAULT_PROFILE
    seed: int = 0
    engine: str = DEFAULT_FAMILY
    """The engine family (``--conformance-engine``): one of :data:`conformance.families.FAMILIES` with real
    engines."""
    simulate: bool = False
    """A simulated cluster here, the drop-in fakes as the engines (``--conformance-simulated-cluster``)."""
    health_timeout_s: float = 600.0
    """Real engines load the model and capture kernels before /health answers: minutes on a cold node."""
    _skip: str | None = field(default=None, init=False)
    _checked: bool = field(default=False, init=False)
    _error: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        real = [f.name for f in FAMILIES.values() if f.real is not None]
        if self.engine not in real:
            raise ValueError(f"-m gpu runs {' or '.join(real)} engines, not {self.engine!r}")

    @property  # type: ignore[override]
    def family(self) -> str:
        return self.engine

    @property
    def launch(self) -> RealFamily:
        """How the family runs on the cluster (:mod:`gpu.families`)."""
        return FAMILIES[self.engine].load_real()

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
        if self.simulate:
            missing = missing_software("ray")
            return f"-m gpu on a simulated cluster needs Ray: {missing[0]} ({INSTALL_HINT})" if missing else None
        address = self.ray_address or os.environ.get("RAY_ADDRESS")
        problems = missing_software("ray", self.launch.package)
        if address is None and visible_gpus() == 0:
            problems.append("no GPU is visible here and no Ray cluster was given (--conformance-ray-address or "
                            "RAY_ADDRESS)")
        needs = f"-m gpu needs real {self.launch.title} on GPUs"
        if problems:
            return f"{needs}: {'; '.join(problems)} ({INSTALL_HINT})"
        from .cluster import connect

        connect(address)
        import ray

        if ray.cluster_resources().get("GPU", 0) == 0:
            return f"{needs}: the Ray cluster at {address or 'this machine'} has no GPU"
        return None

    def why_not(self, scenario: str) -> str | None:
        """What the family's GPUs cannot run (``RealFamily.on_gpus``; vLLM: the scenarios only its native weight
        transfer runs, :data:`gpu.families.NO_GLOO_ENGINE`); the simulated cluster's drop-in runs everything."""
        on_gpus = self.launch.on_gpus
        return None if self.simulate or on_gpus is None else on_gpus(scenario)

    def model(self) -> tuple[str, dict[str, bytes] | None]:
        """The served model's path and, for the built tiny model, its files to write on every engine's node."""
        if self.model_path:
            return self.model_path, None
        built = self.tiny_model()
        return built, {p.name: p.read_bytes() for p in Path(built).iterdir()}

    def config(self) -> Any:
        """What each engine starts with: ``max(2, nodes)`` engines over ``nodes`` nodes, one GPU each, or a share
        of one when a node holds several (the tiny model fits many times on a GPU); the family's launch line, and
        on a simulated cluster its drop-in fake."""
        from .backend import RayBackendConfig

        launch, (path, files) = self.launch, self.model()
        engines = max(2, self.nodes)
        per_node = -(-engines // self.nodes)
        share = round(0.8 / per_node, 2) if per_node > 1 else None
        memory = (launch.memory_flag, str(share)) if share is not None and launch.memory_flag else ()
        transfer = () if launch.weight_transfer is None else (
            "--weight-transfer-config", json.dumps({"backend": launch.weight_transfer[self.simulate]}))
        spec = EngineSpec(model_path=path, enable_lora=True, random_seed=self.seed,
                          mem_fraction_static=share if launch.memory_flag is None else None,
                          extra_args=(*launch.flags, *transfer, *memory),
                          fake_args=launch.fake_args(self.profile) if self.simulate else ())
        return RayBackendConfig(spec, engines=engines, nodes=self.nodes,
                                program=launch.drop_in if self.simulate else launch.program,
                                resources_per_engine={"CPU": 1, "GPU": round(1 / per_node, 4)},
                                health_timeout_s=self.health_timeout_s, profile=self.recorded_profile,
                                env=dict(launch.env), model_files=files,
                                engine_host="127.0.0.1" if self.simulate else None)

    @property
    def recorded_profile(self) -> str:
        """The SGLang release the wire is recorded as: SGLang's profile, or the suite's vocabulary for the others."""
        return FAMILIES[self.engine].recorded_profile(self.profile)

    def make(self, config: Any) -> Any:
        """Engines in Ray actors on the cluster (a simulated one is started at the first)."""
        from .backend import RayBackend

        if self.simulate:
            self.simulated_cluster(nodes=self.nodes, cpus_per_node=-(-config.engines // self.nodes), gpus_per_node=1)
        return RayBackend(config)

    def describe(self) -> str:
        if self.simulate:
            return f"the {self.launch.title} drop-in fake on a simulated {self.nodes}-node Ray cluster"
        return f"real {self.launch.title} on a {self.nodes}-node Ray cluster"

    def close(self) -> None:
        connected = self._checked and self._skip is None and self._error is None and not self.simulate
        try:
            super().close()
        finally:
            if connected:  # the cluster it was pointed at: the driver disconnects
                import ray

                ray.shutdown()
