"""Real SGLang on a CPU-only machine: one virtual environment per release, built from the package registries.

``python -m gpu.sglang_cpu install --release V [--venv DIR]`` builds (once; a second run prints "up to date")
the environment measured in ``docs/backends.md``: ``sglang==V`` without its CUDA dependencies, the
local CPU ``torch==2.13.0`` (pinned by a constraints file, so nothing pulls a CUDA build), the pure-Python packages
that release imports (at the release's own pins), ``triton``/``xgrammar``/``compressed-tensors``/``apache-tvm-ffi``
without their dependencies, ``torchvision`` with its CUDA-linked extensions removed, and
:mod:`gpu.sgl_kernel_standin` installed as ``sgl_kernel`` (refused where a real kernel package is).

``python -m gpu.sglang_cpu check --release V [--venv DIR]`` says whether an environment is usable (exit 0) or
what to run (exit 1). :data:`CPU_ENV` and :data:`CPU_FLAGS` are what an engine from it is started with.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

from fakes.facts import SGLANG

RELEASES = SGLANG.cpu_releases
"""The releases it installs (``real_on_cpu`` rows of ``fakes.facts.SGLANG``), oldest first."""
TORCH = "torch==2.13.0"
"""The local CPU wheel; every pip step is constrained to it."""
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
STAMP = "weightsync-sglang-cpu.json"
BUILDING = "weightsync-sglang-cpu.building"
STANDIN = Path(__file__).with_name("sgl_kernel_standin.py")
UNPINNED = Path(__file__).with_name("unpinned_sitecustomize.py")
CPU_LORA_FLAGS = ("--lora-backend", "torch_native")
"""With LoRA on CPU: SGLang's default LoRA backend (``csgmv``) is Triton kernels; ``torch_native`` is plain torch."""


class InstallError(RuntimeError):
    """A step of the install failed; the message is one line naming the step."""


def default_venv(release: str) -> Path:
    """Where ``install`` puts a release's environment unless ``--venv`` says otherwise (outside the repository)."""
    root = os.environ.get("WEIGHTSYNC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "weightsync-conformance")
    return Path(root) / f"sglang-{release}"


def python_of(venv: Path) -> Path:
    """The environment's interpreter."""
    return venv / "bin" / "python"


def recipe(release: str) -> str:
    """A digest of everything the install does for ``release``: a change to the recipe rebuilds the environment."""
    text = json.dumps([release, CONSTRAINTS, NO_DEPS, PURE_DEPS, CPU_FLAGS, STANDIN.read_text(), UNPINNED.read_text(),
                       _TORCHVISION_GUARD, sys.version_info[:2]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_release(release: str) -> str:
    """``release`` if the installer knows it, else a one-line error."""
    if release not in RELEASES:
        raise InstallError(f"unknown release {release!r}: choose one of {', '.join(RELEASES)}")
    return release


@dataclass(frozen=True)
class Status:
    """Whether an environment serves real SGLang on CPU, and what is in it."""

    venv: Path
    usable: bool
    reason: str
    versions: dict[str, str]

    def line(self) -> str:
        if self.usable:
            return (f"{self.venv}: usable — " + ", ".join(f"{k} {v}" for k, v in self.versions.items()))
        return f"{self.venv}: not usable — {self.reason}"


def read_stamp(venv: Path) -> dict | None:
    try:
        return json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return None


def status(release: str, venv: Path | None = None, import_check: bool = True) -> Status:
    """Is the environment for ``release`` installed by this recipe (and, with ``import_check``, does sglang import)?"""
    venv = Path(venv) if venv else default_venv(release)
    install = f"run: python -m gpu.sglang_cpu install --release {release}" + (
        "" if venv == default_venv(release) else f" --venv {venv}")
    stamp = read_stamp(venv)
    if not python_of(venv).exists() or stamp is None:
        return Status(venv, False, f"no real-SGLang-on-CPU environment there; {install}", {})
    if stamp.get("release") != release:
        return Status(venv, False, f"it holds sglang {stamp.get('release')}, not {release}; {install}", {})
    if stamp.get("recipe") != recipe(release):
        return Status(venv, False, f"built by an older recipe; {install}", {})
    versions = dict(stamp.get("versions", {}))
    if import_check:
        probe = ("import json, sglang, torch, transformers; import sglang.srt.server_args; "
                 "print(json.dumps({'sglang': sglang.__version__, 'torch': torch.__version__, "
                 "'transformers': transformers.__version__}))")
        done = subprocess.run([str(python_of(venv)), "-c", probe], capture_output=True, text=True,
                              env={**os.environ, **CPU_ENV}, timeout=300)
        if done.returncode != 0:
            return Status(venv, False, f"sglang does not import: {_last_line(done.stderr)}; {install}", versions)
        versions = json.loads(done.stdout.strip().splitlines()[-1])
        if versions.get("sglang") != release:
            return Status(venv, False, f"sglang {versions.get('sglang')} imports, not {release}", versions)
    return Status(venv, True, "", versions)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


class Installer:
    """Builds one release's environment step by step, logging every command to ``VENV/install.log``."""

    def __init__(self, release: str, venv: Path) -> None:
        self.release = check_release(release)
        self.venv = Path(venv)
        self.log_path = self.venv.parent / f"{self.venv.name}.install.log"

    def run(self, step: str, command: Sequence[str]) -> str:
        """Run one step; a failure is one line naming it (the full output is in the log)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"\n=== {step}: {' '.join(command)}\n")
            log.flush()
            done = subprocess.run(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
            log.write(done.stdout)
        if done.returncode != 0:
            raise InstallError(f"step '{step}' failed (exit {done.returncode}): {_last_line(done.stdout)} "
                               f"[log: {self.log_path}]")
        return done.stdout

    def pip(self, step: str, *args: str) -> str:
        return self.run(step, [str(python_of(self.venv)), "-m", "pip", "install", "--quiet",
                               "-c", str(self.venv / "constraints.txt"), *args])

    def site_packages(self) -> Path:
        found = sorted((self.venv / "lib").glob("python3*/site-packages"))
        if not found:
            raise InstallError(f"step 'venv' failed: no site-packages under {self.venv / 'lib'}")
        return found[0]

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
                pins[_canon(name)] = spec
        return pins

    def install(self) -> Status:
        ours = read_stamp(self.venv) is not None or (self.venv / BUILDING).exists()  # built, or interrupted
        if self.venv.exists() and any(self.venv.iterdir()) and not ours:
            raise InstallError(f"{self.venv} exists and was not built by this installer: pass another --venv or "
                               "remove it")
        if self.venv.exists():
            shutil.rmtree(self.venv)
        self.log_path.unlink(missing_ok=True)
        self.venv.mkdir(parents=True)
        (self.venv / BUILDING).write_text("an unfinished build of gpu.sglang_cpu; the next install removes it\n")
        self.run("venv", [sys.executable, "-m", "venv", str(self.venv)])
        (self.venv / "constraints.txt").write_text("\n".join(CONSTRAINTS) + "\n")
        self.pip("sglang", "--no-deps", f"sglang=={self.release}")
        pins = self.release_pins()
        self.pip("no-deps packages", "--no-deps", *(pins.get(_canon(n), n) for n in NO_DEPS))
        self.pip("torch and pure-Python dependencies", TORCH, *(pins.get(_canon(n), n) for n in PURE_DEPS))
        self.patch_torchvision()
        self.install_standin()
        shutil.copyfile(UNPINNED, self.site_packages() / "sitecustomize.py")
        versions = self.freeze()
        (self.venv / STAMP).write_text(json.dumps(
            {"release": self.release, "recipe": recipe(self.release), "versions": versions,
             "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
        (self.venv / BUILDING).unlink()
        return status(self.release, self.venv)

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
            if _canon(dist.name.split("-")[0]) in {_canon(n) for n in REAL_KERNEL_DISTS}:
                raise InstallError(f"step 'sgl_kernel stand-in' refused: a real kernel package is installed "
                                   f"({dist.name}); the stand-in never replaces it")
        install_standin(site)

    def freeze(self) -> dict[str, str]:
        out = self.run("pip freeze", [str(python_of(self.venv)), "-m", "pip", "list", "--format", "json"])
        wanted = {"sglang", "torch", "torchvision", "triton", "transformers", "tokenizers", "xgrammar"}
        listed = json.loads(out.strip().splitlines()[-1])
        return {row["name"]: row["version"] for row in listed if _canon(row["name"]) in wanted}


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


_TORCHVISION_GUARD = "# weightsync-conformance: torchvision's CUDA-linked _C was removed (gpu/sglang_cpu.py)"


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def disk_use(path: Path) -> int:
    """Bytes under ``path`` (files only, links not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def install(release: str, venv: Path | None = None, force: bool = False, out: TextIO | None = None) -> Status:
    """Build the environment for ``release`` unless it is already there (prints what it did, its time and disk)."""
    out = out or sys.stdout
    release = check_release(release)
    venv = Path(venv).expanduser().absolute() if venv else default_venv(release)
    started = time.monotonic()
    current = status(release, venv, import_check=False)
    if current.usable and not force:
        print(f"sglang {release} on CPU: up to date at {venv} ({time.monotonic() - started:.2f} s)", file=out)
        return current
    print(f"sglang {release} on CPU: building {venv} ...", file=out, flush=True)
    result = Installer(release, venv).install()
    if not result.usable:
        raise InstallError(f"step 'import check' failed: {result.reason}")
    size = disk_use(venv) / 2**30
    print(f"sglang {release} on CPU: installed at {venv} in {time.monotonic() - started:.0f} s, {size:.2f} GiB "
          f"({', '.join(f'{k} {v}' for k, v in result.versions.items())})", file=out)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu.sglang_cpu", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("install", "build the environment (a no-op when it is up to date)"),
                            ("check", "say whether the environment is usable (exit 0) or what to run (exit 1)")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--release", required=True, help=f"SGLang release: {', '.join(RELEASES)}")
        sub.add_argument("--venv", type=Path, help="environment directory (default: ~/.cache/weightsync-conformance"
                                                   "/sglang-RELEASE, or under $WEIGHTSYNC_CACHE)")
        if name == "install":
            sub.add_argument("--force", action="store_true", help="rebuild even when up to date")
        else:
            sub.add_argument("--json", action="store_true", help="print the status as JSON")
            sub.add_argument("--no-import", action="store_true",
                             help="check the stamp only (instant; by default sglang is imported, ~10-30 s)")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            install(args.release, args.venv, force=args.force)
            return 0
        result = status(check_release(args.release), args.venv.expanduser().absolute() if args.venv else None,
                        import_check=not args.no_import)
    except InstallError as error:
        print(f"gpu.sglang_cpu: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpu.sglang_cpu: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps({"venv": str(result.venv), "usable": result.usable, "reason": result.reason,
                          "versions": result.versions, "env": CPU_ENV, "flags": list(CPU_FLAGS)}))
    else:
        print(result.line())
    return 0 if result.usable else 1


if __name__ == "__main__":
    sys.exit(main())
