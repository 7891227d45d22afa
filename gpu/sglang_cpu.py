"""Real SGLang on a CPU-only machine: one virtual environment per release, built from the package registries.

``python -m gpu.sglang_cpu install --release V [--venv DIR]`` builds (once; a second run prints "up to date")
the environment measured in ``docs/backends.md``: ``sglang==V`` without its CUDA dependencies, the
local CPU ``torch==2.13.0`` (pinned by a constraints file, so nothing pulls a CUDA build), the pure-Python packages
that release imports (at the release's own pins), ``triton``/``xgrammar``/``compressed-tensors``/``apache-tvm-ffi``
without their dependencies, ``torchvision`` with its CUDA-linked extensions removed, and
:mod:`gpu.sgl_kernel_standin` installed as ``sgl_kernel`` (refused where a real kernel package is).

``python -m gpu.sglang_cpu check --release V [--venv DIR]`` says whether an environment is usable (exit 0) or
what to run (exit 1). :data:`CPU_ENV` and :data:`CPU_FLAGS` are what an engine from it is started with. The
lifecycle (stamp, up to date, interrupted builds, the log) is :mod:`gpu.engine_env`'s; this module is the recipe.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from fakes.facts import SGLANG

from . import engine_env
from .engine_env import Family, canon, digest
from .engine_env import TORCH, InstallError, Status, disk_use, python_of  # noqa: F401 — this module's public names

RELEASES = SGLANG.cpu_releases
"""The releases it installs (``real_on_cpu`` rows of ``fakes.facts.SGLANG``), oldest first."""
CONSTRAINTS = (TORCH, "torchvision==0.28.0", "triton==3.8.0")
NO_DEPS = ("triton", "torchvision", "xgrammar", "compressed-tensors", "apache-tvm-ffi")
"""Installed with ``--no-deps`` (their dependencies pull CUDA torch/triton); at the release's pin where it has one."""
PURE_DEPS = (
    "fastapi", "uvicorn", "uvloop", "pyzmq", "orjson", "pydantic", "msgspec", "psutil", "setproctitle", "pybase64",
    "safetensors", "numpy", "requests", "aiohttp", "interegular", "partial_json_parser", "regex", "python-multipart",
    "prometheus-client", "pillow", "einops", "scipy", "xxhash", "watchfiles", "zstandard", "distro", "IPython",
    "openai", "tiktoken", "sentencepiece", "anthropic", "blobfile", "gguf", "nvidia-ml-py", "dill", "loguru",
    "jsonschema", "soundfile", "transformers", "tokenizers", "tqdm", "packaging", "python-dateutil", "ninja",
    "typing-extensions",
)
"""What SGLang imports at start-up on the CPU path (the doc's list), at the release's pins where it has them."""
REAL_KERNEL_DISTS = ("sgl-kernel", "sglang-kernel", "sgl_kernel", "sglang_kernel")

CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "WEIGHTSYNC_UNPINNED": "1"}
"""``SGLANG_USE_CPU_ENGINE``: without it the scheduler imports ``vllm._custom_ops``
(``layers/rotary_embedding/base.py``) and dies. ``WEIGHTSYNC_UNPINNED``: the environment's ``sitecustomize``
(:data:`UNPINNED`) drops the host-memory pinning SGLang's LoRA layers ask for, which torch refuses without an
accelerator."""
CPU_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--tp", "1",
             "--skip-server-warmup", "--max-total-tokens", "32768", "--mem-fraction-static", "0.2")
"""SGLang's launch flags for CPU (without ``--max-total-tokens`` the KV pool is 0.2 × RAM: 5.7 GB, 13 s)."""

STANDIN = Path(__file__).with_name("sgl_kernel_standin.py")
UNPINNED = Path(__file__).with_name("unpinned_sitecustomize.py")
CPU_LORA_FLAGS = ("--lora-backend", "torch_native")
"""With LoRA on CPU: SGLang's default LoRA backend (``csgmv``) is Triton kernels; ``torch_native`` is plain torch."""
PROBE = ("import json, sglang, torch, transformers; import sglang.srt.server_args; "
         "print(json.dumps({'sglang': sglang.__version__, 'torch': torch.__version__, "
         "'transformers': transformers.__version__}))")
"""The import check: prints the versions it imported."""
_TORCHVISION_GUARD = "# weightsync-conformance: torchvision's CUDA-linked _C was removed (gpu/sglang_cpu.py)"


def recipe(release: str) -> str:
    """A digest of everything the install does for ``release``: a change to the recipe rebuilds the environment."""
    return digest(release, CONSTRAINTS, NO_DEPS, PURE_DEPS, CPU_FLAGS, STANDIN.read_text(), UNPINNED.read_text(),
                  _TORCHVISION_GUARD, sys.version_info[:2])


FAMILY = Family(
    name="sglang", title="SGLang", module="gpu.sglang_cpu", releases=RELEASES, constraints=CONSTRAINTS,
    env=CPU_ENV, flags=CPU_FLAGS, probe=PROBE, recipe=recipe, summary=__doc__.split("\n\n")[0],
    reported=frozenset({"sglang", "torch", "torchvision", "triton", "transformers", "tokenizers", "xgrammar"}))
"""SGLang's environments, for :mod:`gpu.engine_env`."""
STAMP = FAMILY.stamp
BUILDING = FAMILY.building


default_venv = FAMILY.default_venv
"""Where ``install`` puts a release's environment unless ``--venv`` says otherwise (outside the repository)."""
check_release = FAMILY.check_release
"""``release`` if the installer knows it, else a one-line :class:`InstallError`."""
read_stamp = FAMILY.read_stamp
"""The stamp of a finished environment, or None."""
status = FAMILY.status
"""Is the environment for ``release`` installed by this recipe (and, with ``import_check``, does it import)?"""
VENV_ENV = "WEIGHTSYNC_SGLANG_VENV"
"""The environment ``-m sglang`` runs from when ``--conformance-sglang-venv`` does not say."""


def chosen(release: str | None = None, venv: str | None = None) -> tuple[str, str | None]:
    """The release and environment ``-m sglang`` runs: ``release``, else the one the environment holds (its stamp),
    else the default profile's; ``venv``, else :data:`VENV_ENV`'s (None: where ``install`` puts the release's)."""
    from fakes.profiles import DEFAULT_PROFILE

    venv = venv or os.environ.get(VENV_ENV) or None
    if release is None and venv:
        release = (read_stamp(Path(venv)) or {}).get("release")
    return release or DEFAULT_PROFILE, venv


class Installer(engine_env.Installer):
    """Builds one SGLang release's environment (the steps; the lifecycle is :class:`gpu.engine_env.Installer`)."""

    family = FAMILY

    def steps(self) -> None:
        """sglang without dependencies, the no-deps packages and torch with the pure-Python ones at the release's
        pins, the torchvision fix, the ``sgl_kernel`` stand-in and the unpinning ``sitecustomize``."""
        self.pip("sglang", "--no-deps", f"sglang=={self.release}")
        pins = self.release_pins()
        self.pip("no-deps packages", "--no-deps", *(pins.get(canon(n), n) for n in NO_DEPS))
        self.pip("torch and pure-Python dependencies", TORCH, *(pins.get(canon(n), n) for n in PURE_DEPS))
        self.patch_torchvision()
        self.install_standin()
        shutil.copyfile(UNPINNED, self.site_packages() / "sitecustomize.py")

    def release_pins(self) -> dict[str, str]:
        """The release's own requirement for each package it names (``Requires-Dist`` without markers)."""
        metadata = next(self.site_packages().glob(f"sglang-{self.release}.dist-info/METADATA"), None)
        if metadata is None:
            raise InstallError(f"step 'sglang' failed: no sglang-{self.release}.dist-info in the environment")
        pins = {}
        for line in metadata.read_text().splitlines():
            if line.startswith("Requires-Dist:") and ";" not in line:
                spec = line.split(":", 1)[1].strip()
                name = re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0]
                pins[canon(name)] = spec
        return pins

    def patch_torchvision(self) -> None:
        """Remove torchvision's two CUDA-linked extensions and make its ``nms``/``qnms`` fakes conditional."""
        root = self.site_packages() / "torchvision"
        for extension in [*root.glob("_C*.so"), *root.glob("image*.so")]:
            extension.unlink()
        meta = root / "_meta_registrations.py"
        text = meta.read_text()
        if _TORCHVISION_GUARD not in text:
            patched, count = re.subn(r'^@torch\.library\.register_fake\(("torchvision::q?nms")\)$',
                                     rf"@(torch.library.register_fake(\1) if torchvision.extension._has_ops() "
                                     rf"else (lambda fn: fn))  {_TORCHVISION_GUARD}", text, flags=re.M)
            if count != 2:
                raise InstallError(f"step 'torchvision fix' failed: found {count} nms/qnms fake registrations in "
                                   f"{meta}, expected 2")
            meta.write_text(patched)

    def install_standin(self) -> None:
        """Install :mod:`gpu.sgl_kernel_standin` as ``sgl_kernel``, refusing where a real kernel package is."""
        site = self.site_packages()
        for dist in site.glob("*.dist-info"):
            if canon(dist.name.split("-")[0]) in {canon(n) for n in REAL_KERNEL_DISTS}:
                raise InstallError(f"step 'sgl_kernel stand-in' refused: a real kernel package is installed "
                                   f"({dist.name}); the stand-in never replaces it")
        install_standin(site)


def install_standin(site: Path) -> Path:
    """Copy the stand-in to ``site/sgl_kernel/__init__.py``; refuse when an ``sgl_kernel`` there is not ours."""
    target = site / "sgl_kernel"
    init = target / "__init__.py"
    if target.exists() and not (init.exists() and "IS_WEIGHTSYNC_STANDIN = True" in init.read_text()):
        raise InstallError(f"step 'sgl_kernel stand-in' refused: {target} is a real kernel package; the stand-in "
                           "never replaces it")
    target.mkdir(exist_ok=True)
    shutil.copyfile(STANDIN, init)
    return init


install, main = engine_env.commands(Installer)
"""``install(release, venv=None, force=False, out=None)`` builds an environment unless it is up to date;
``main(argv)`` is ``python -m`` this module."""


if __name__ == "__main__":
    sys.exit(main())
