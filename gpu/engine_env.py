"""Real inference engines on a CPU-only machine: what every engine family's installer shares.

One virtual environment per family and release, built from the package registries by a family's
:class:`Installer` subclass (its :meth:`Installer.steps`), stamped with the release, a digest of the recipe and the
versions it holds. A second install of an up-to-date environment is a no-op; an interrupted one (``.building``
marker) is removed and rebuilt; a directory the installer did not build is never touched. Every failed step is one
line naming the step and the install log (next to the environment). :func:`main` is a family's command line:
``install --release V [--venv DIR] [--force]`` and ``check --release V [--venv DIR] [--json] [--no-import]``.

Standard library only: the plugin reads a family's releases and stamps without importing anything heavy.
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
from typing import Callable, ClassVar, Mapping, Sequence, TextIO

TORCH = "torch==2.13.0"
"""The local CPU wheel; every family's pip steps are constrained to it (a bare ``torch`` pulls a CUDA build)."""
CONSTRAINTS_FILE = "constraints.txt"
"""Inside the environment: the family's constraints, passed to every ``pip install``."""
PROBE_TIMEOUT_S = 300
"""How long the import check may take (a loaded machine imports an engine in tens of seconds)."""


class InstallError(RuntimeError):
    """A step of the install failed; the message is one line naming the step."""


def cache_root() -> Path:
    """Where environments live unless ``--venv`` says otherwise: ``$WEIGHTSYNC_CACHE``, else
    ``$XDG_CACHE_HOME/weightsync-conformance``, else ``~/.cache/weightsync-conformance`` (outside the repository)."""
    root = os.environ.get("WEIGHTSYNC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "weightsync-conformance")
    return Path(root)


def python_of(venv: Path) -> Path:
    """The environment's interpreter."""
    return venv / "bin" / "python"


def digest(*parts: object) -> str:
    """A short digest of a recipe's parts (JSON-serialisable)."""
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()[:16]


def canon(name: str) -> str:
    """A distribution name in its canonical form (``Foo_bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def last_line(text: str) -> str:
    """The last non-empty line of ``text`` (at most 300 characters), for one-line errors."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


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


@dataclass(frozen=True)
class Status:
    """Whether an environment serves a real engine on CPU, and what is in it."""

    venv: Path
    usable: bool
    reason: str
    versions: dict[str, str]

    def line(self) -> str:
        """One line: usable with the versions, or not usable with the reason."""
        if self.usable:
            return (f"{self.venv}: usable — " + ", ".join(f"{k} {v}" for k, v in self.versions.items()))
        return f"{self.venv}: not usable — {self.reason}"


@dataclass(frozen=True)
class Family:
    """What differs between engine families' environments (the lifecycle around it is shared)."""

    name: str
    """Short name: the environment's directory (``NAME-RELEASE``), its stamp, the probe's version key."""
    title: str
    """As people write it, in messages (``SGLang``, ``vLLM``)."""
    module: str
    """The installer's module, as ``python -m`` runs it (in the install line and error prefix)."""
    releases: tuple[str, ...]
    """The releases it installs, oldest first."""
    constraints: tuple[str, ...]
    """Every ``pip install`` is constrained to these."""
    env: Mapping[str, str]
    """The environment variables an engine (and the import probe) runs with."""
    flags: tuple[str, ...]
    """The engine's launch flags for CPU."""
    probe: str
    """Python source run in the environment: prints a JSON object of versions, ``name`` among them."""
    recipe: Callable[[str], str]
    """A digest of everything the install does for a release: a change rebuilds the environment."""
    reported: frozenset[str]
    """The distributions (canonical names) whose versions the stamp records."""
    summary: str
    """One line for ``--help``."""

    @property
    def stamp(self) -> str:
        """The stamp file's name inside a finished environment."""
        return f"weightsync-{self.name}-cpu.json"

    @property
    def building(self) -> str:
        """The marker file's name inside an unfinished environment."""
        return f"weightsync-{self.name}-cpu.building"

    def check_release(self, release: str) -> str:
        """``release`` if the installer knows it, else a one-line error."""
        if release not in self.releases:
            raise InstallError(f"unknown release {release!r}: choose one of {', '.join(self.releases)}")
        return release

    def default_venv(self, release: str) -> Path:
        """Where ``install`` puts a release's environment unless ``--venv`` says otherwise."""
        return cache_root() / f"{self.name}-{release}"

    def install_command(self, release: str, venv: Path | None = None) -> str:
        """The command line that builds ``release`` at ``venv`` (``--venv`` only where it is not the default)."""
        return f"python -m {self.module} install --release {release}" + (
            "" if venv is None or venv == self.default_venv(release) else f" --venv {venv}")

    def read_stamp(self, venv: Path) -> dict | None:
        """The stamp of a finished environment, or None."""
        try:
            return json.loads((Path(venv) / self.stamp).read_text())
        except (OSError, ValueError):
            return None

    def status(self, release: str, venv: Path | None = None, import_check: bool = True) -> Status:
        """Is the environment for ``release`` built by this recipe (and, with ``import_check``, does it import)?"""
        venv = Path(venv) if venv else self.default_venv(release)
        install = f"run: {self.install_command(release, venv)}"
        stamp = self.read_stamp(venv)
        if stamp is None and (venv / self.building).exists():
            return Status(venv, False, f"an interrupted build; {install}", {})
        if stamp is None and python_of(venv).exists():
            return Status(venv, False, f"not built by this installer (no {self.stamp}), which never overwrites it; "
                                       f"remove it or pick another --venv, then {install}", {})
        if not python_of(venv).exists() or stamp is None:
            return Status(venv, False, f"no real-{self.title}-on-CPU environment there; {install}", {})
        if stamp.get("release") != release:
            return Status(venv, False, f"it holds {self.name} {stamp.get('release')}, not {release}; {install}", {})
        if stamp.get("recipe") != self.recipe(release):
            return Status(venv, False, f"built by an older recipe; {install}", {})
        versions = dict(stamp.get("versions", {}))
        if import_check:
            try:
                done = subprocess.run([str(python_of(venv)), "-c", self.probe], capture_output=True, text=True,
                                      env={**os.environ, **self.env}, timeout=PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return Status(venv, False, f"{self.name} did not import within {PROBE_TIMEOUT_S} s", versions)
            if done.returncode != 0:
                return Status(venv, False, f"{self.name} does not import: {last_line(done.stderr)}; {install}",
                              versions)
            versions = json.loads(done.stdout.strip().splitlines()[-1])
            if versions.get(self.name) != release:
                return Status(venv, False, f"{self.name} {versions.get(self.name)} imports, not {release}", versions)
        return Status(venv, True, "", versions)


class Installer:
    """Builds one release's environment: the shared lifecycle around a family's :meth:`steps`, every command logged
    to ``VENV.install.log`` next to the environment. A subclass sets :attr:`family` and implements :meth:`steps`."""

    family: ClassVar[Family]

    def __init__(self, release: str, venv: Path) -> None:
        self.release = self.family.check_release(release)
        self.venv = Path(venv)
        self.log_path = self.venv.parent / f"{self.venv.name}.install.log"

    def steps(self) -> None:
        """The family's steps, run in a fresh environment whose constraints file is written."""
        raise NotImplementedError

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
            raise InstallError(f"step '{step}' failed (exit {done.returncode}): {last_line(done.stdout)} "
                               f"[log: {self.log_path}]")
        return done.stdout

    def pip(self, step: str, *args: str) -> str:
        """``pip install`` into the environment, constrained by the family's constraints."""
        return self.run(step, [str(python_of(self.venv)), "-m", "pip", "install", "--quiet",
                               "-c", str(self.venv / CONSTRAINTS_FILE), *args])

    def pip_uninstall(self, step: str, *names: str) -> str:
        """``pip uninstall -y`` from the environment (a package that is not installed is skipped)."""
        return self.run(step, [str(python_of(self.venv)), "-m", "pip", "uninstall", "-y", *names])

    def site_packages(self) -> Path:
        """The environment's ``site-packages``."""
        found = sorted((self.venv / "lib").glob("python3*/site-packages"))
        if not found:
            raise InstallError(f"step 'venv' failed: no site-packages under {self.venv / 'lib'}")
        return found[0]

    def install(self) -> Status:
        """Build the environment from scratch (refusing a directory it did not build), stamp it, check it."""
        family = self.family
        ours = family.read_stamp(self.venv) is not None or (self.venv / family.building).exists()
        if self.venv.exists() and any(self.venv.iterdir()) and not ours:
            raise InstallError(f"{self.venv} exists and was not built by this installer: pass another --venv or "
                               "remove it")
        if self.venv.exists():
            shutil.rmtree(self.venv)
        self.log_path.unlink(missing_ok=True)
        self.venv.mkdir(parents=True)
        (self.venv / family.building).write_text(
            f"an unfinished build of {family.module}; the next install removes it\n")
        self.run("venv", [sys.executable, "-m", "venv", str(self.venv)])
        (self.venv / CONSTRAINTS_FILE).write_text("\n".join(family.constraints) + "\n")
        self.steps()
        versions = self.freeze()
        (self.venv / family.stamp).write_text(json.dumps(
            {"release": self.release, "recipe": family.recipe(self.release), "versions": versions,
             "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
        (self.venv / family.building).unlink()
        return family.status(self.release, self.venv)

    def freeze(self) -> dict[str, str]:
        """The versions of the family's reported distributions in the environment."""
        out = self.run("pip freeze", [str(python_of(self.venv)), "-m", "pip", "list", "--format", "json"])
        listed = json.loads(out.strip().splitlines()[-1])
        return {row["name"]: row["version"] for row in listed if canon(row["name"]) in self.family.reported}


def install(installer: type[Installer], release: str, venv: Path | None = None, force: bool = False,
            out: TextIO | None = None) -> Status:
    """Build the environment for ``release`` unless it is already there (prints what it did, its time and disk)."""
    out = out or sys.stdout
    family = installer.family
    release = family.check_release(release)
    venv = Path(venv).expanduser().absolute() if venv else family.default_venv(release)
    started = time.monotonic()
    current = family.status(release, venv, import_check=False)
    if current.usable and not force:
        print(f"{family.name} {release} on CPU: up to date at {venv} ({time.monotonic() - started:.2f} s)", file=out)
        return current
    print(f"{family.name} {release} on CPU: building {venv} ...", file=out, flush=True)
    result = installer(release, venv).install()
    if not result.usable:
        raise InstallError(f"step 'import check' failed: {result.reason}")
    size = disk_use(venv) / 2**30
    print(f"{family.name} {release} on CPU: installed at {venv} in {time.monotonic() - started:.0f} s, "
          f"{size:.2f} GiB ({', '.join(f'{k} {v}' for k, v in result.versions.items())})", file=out)
    return result


def main(installer: type[Installer], argv: Sequence[str] | None = None) -> int:
    """A family's command line (``install`` and ``check``); the exit status."""
    family = installer.family
    parser = argparse.ArgumentParser(prog=f"python -m {family.module}", description=family.summary)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("install", "build the environment (a no-op when it is up to date)"),
                            ("check", "say whether the environment is usable (exit 0) or what to run (exit 1)")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("--release", required=True, help=f"{family.title} release: {', '.join(family.releases)}")
        sub.add_argument("--venv", type=Path, help=f"environment directory (default: ~/.cache/weightsync-conformance"
                                                   f"/{family.name}-RELEASE, or under $WEIGHTSYNC_CACHE)")
        if name == "install":
            sub.add_argument("--force", action="store_true", help="rebuild even when up to date")
        else:
            sub.add_argument("--json", action="store_true", help="print the status as JSON")
            sub.add_argument("--no-import", action="store_true",
                             help=f"check the stamp only (instant; by default {family.name} is imported, ~10-30 s)")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            install(installer, args.release, args.venv, force=args.force)
            return 0
        result = family.status(family.check_release(args.release),
                               args.venv.expanduser().absolute() if args.venv else None,
                               import_check=not args.no_import)
    except InstallError as error:
        print(f"{family.module}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{family.module}: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps({"venv": str(result.venv), "usable": result.usable, "reason": result.reason,
                          "versions": result.versions, "env": dict(family.env), "flags": list(family.flags)}))
    else:
        print(result.line())
    return 0 if result.usable else 1


def commands(installer: type[Installer]) -> tuple[Callable[..., Status], Callable[[Sequence[str] | None], int]]:
    """A family module's ``install(release, venv=None, force=False, out=None)`` and ``main(argv=None)``, bound to
    its installer."""
    def install_release(release: str, venv: Path | None = None, force: bool = False,
                        out: TextIO | None = None) -> Status:
        """Build the environment for ``release`` unless it is already there (prints what it did, its time and
        disk)."""
        return install(installer, release, venv, force, out)

    def family_main(argv: Sequence[str] | None = None) -> int:
        """``python -m <module> install|check``; the exit status."""
        return main(installer, argv)
    return install_release, family_main

