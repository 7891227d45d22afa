"""The real-SGLang-on-CPU installer without the environment: its argument errors, the ``sgl_kernel`` stand-in (its
two ops against plain-torch references, its raising names, its refusal to replace a real kernel package), the
torchvision fix, and the up-to-date logic (a stamped environment is a no-op; anything else is rebuilt or refused)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gpu import sglang_cpu
from gpu import sgl_kernel_standin as standin
from gpu.sglang_cpu import InstallError, Installer, install, install_standin, main, recipe, status

pytestmark = pytest.mark.cpu


def test_an_unknown_release_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--release", "0.4.0", "--venv", "/nonexistent/x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "gpu.sglang_cpu: unknown release '0.4.0': choose one of 0.5.10, 0.5.15, 0.5.23"


def test_a_missing_release_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["install"])
    assert exit_info.value.code == 2


def test_check_says_what_to_run_when_there_is_no_environment(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--release", "0.5.23", "--venv", str(tmp_path / "none")]) == 1
    out = capsys.readouterr().out
    assert "not usable" in out and f"python -m gpu.sglang_cpu install --release 0.5.23 --venv {tmp_path / 'none'}" in out


def test_the_default_environment_is_outside_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WEIGHTSYNC_CACHE", str(tmp_path))
    assert sglang_cpu.default_venv("0.5.15") == tmp_path / "sglang-0.5.15"
    monkeypatch.delenv("WEIGHTSYNC_CACHE")
    repo = Path(__file__).resolve().parents[2]
    assert repo not in sglang_cpu.default_venv("0.5.15").parents


def _stamped_venv(root: Path, release: str, recipe_digest: str) -> Path:
    venv = root / f"sglang-{release}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / sglang_cpu.STAMP).write_text(json.dumps({"release": release, "recipe": recipe_digest,
                                                     "versions": {"sglang": release}}))
    return venv


def test_a_stamped_environment_is_up_to_date_in_well_under_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    venv = _stamped_venv(tmp_path, "0.5.23", recipe("0.5.23"))
    monkeypatch.setattr(subprocess, "run", _no_subprocess)
    started = time.monotonic()
    assert install("0.5.23", venv).usable
    assert time.monotonic() - started < 1.0
    assert "up to date" in capsys.readouterr().out


def _no_subprocess(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"an up-to-date install ran a command: {args}")


def test_an_environment_of_another_recipe_or_release_is_not_usable(tmp_path: Path) -> None:
    old = _stamped_venv(tmp_path / "a", "0.5.23", "0" * 16)
    assert "older recipe" in status("0.5.23", old, import_check=False).reason
    other = _stamped_venv(tmp_path / "b", "0.5.15", recipe("0.5.15"))
    assert "holds sglang 0.5.15, not 0.5.23" in status("0.5.23", other, import_check=False).reason


def test_a_directory_the_installer_did_not_build_is_never_removed(tmp_path: Path) -> None:
    venv = tmp_path / "mine"
    venv.mkdir()
    (venv / "precious.txt").write_text("x")
    with pytest.raises(InstallError, match="was not built by this installer"):
        Installer("0.5.23", venv).install()
    assert (venv / "precious.txt").exists()


def test_an_interrupted_build_is_removed_and_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "sglang-0.5.23"
    venv.mkdir()
    (venv / sglang_cpu.BUILDING).write_text("")
    (venv / "half-installed").write_text("x")
    steps: list[str] = []

    def stop_at_the_first_step(self: Installer, step: str, command: list[str]) -> str:
        steps.append(step)
        raise InstallError(f"step '{step}' stopped by the test")

    monkeypatch.setattr(Installer, "run", stop_at_the_first_step)
    with pytest.raises(InstallError, match="stopped by the test"):
        Installer("0.5.23", venv).install()
    assert steps == ["venv"] and not (venv / "half-installed").exists() and (venv / sglang_cpu.BUILDING).exists()


def test_a_failed_step_is_one_line_naming_it(tmp_path: Path) -> None:
    installer = Installer("0.5.23", tmp_path / "v")
    with pytest.raises(InstallError) as error:
        installer.run("pure-Python dependencies", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("step 'pure-Python dependencies' failed (exit 3): boom [log: ")


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "v" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    return site


def test_the_stand_in_is_refused_where_a_real_kernel_package_is(tmp_path: Path) -> None:
    site = _site(tmp_path)
    (site / "sglang_kernel-0.4.10.dist-info").mkdir()
    with pytest.raises(InstallError, match="real kernel package is installed"):
        Installer("0.5.23", tmp_path / "v").install_standin()
    assert not (site / "sgl_kernel").exists()


def test_the_stand_in_never_overwrites_a_module_of_that_name_that_is_not_ours(tmp_path: Path) -> None:
    site = _site(tmp_path)
    (site / "sgl_kernel").mkdir()
    (site / "sgl_kernel" / "__init__.py").write_text("from .ops import *\n")
    with pytest.raises(InstallError, match="is a real kernel package"):
        install_standin(site)
    assert (site / "sgl_kernel" / "__init__.py").read_text() == "from .ops import *\n"
    install_standin(_site(tmp_path / "fresh"))  # and installs (and reinstalls) over its own copy
    assert install_standin(tmp_path / "fresh" / "v" / "lib" / "python3.11" / "site-packages").exists()


def test_assign_req_to_token_pool_matches_its_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    req_to_token = torch.zeros((4, 16), dtype=torch.int32)
    rows, starts, ends = torch.tensor([2, 0, 3]), torch.tensor([0, 5, 3]), torch.tensor([4, 6, 9])
    out_cache_loc = torch.randint(1, 1000, (int((ends - starts).sum()),), generator=generator, dtype=torch.int64)
    expected = req_to_token.clone()
    position = 0
    for r, s, e in zip(rows.tolist(), starts.tolist(), ends.tolist()):
        for column in range(s, e):
            expected[r, column] = int(out_cache_loc[position])
            position += 1
    standin.assign_req_to_token_pool_cpu(rows, req_to_token, starts, ends, out_cache_loc, req_to_token.shape[1])
    assert torch.equal(req_to_token, expected)


def test_copy_all_layer_kv_cache_reads_every_source_row_before_writing() -> None:
    generator = torch.Generator().manual_seed(1)
    layers = [torch.randn((10, 3, 4), generator=generator, dtype=torch.bfloat16) for _ in range(2)]
    layers.append(torch.randn((10, 8), generator=generator, dtype=torch.float32))
    before = [layer.clone() for layer in layers]
    data_ptrs = torch.tensor([layer.data_ptr() for layer in layers], dtype=torch.uint64)
    strides = torch.tensor([layer[0].numel() * layer.element_size() for layer in layers], dtype=torch.int64)
    src, tgt = torch.tensor([1, 2, 7]), torch.tensor([2, 7, 0])  # a chain: row 2 is both read and written
    standin.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for layer, original in zip(layers, before):
        expected = original.clone()
        expected[tgt] = original[src]
        assert torch.equal(layer, expected)


@pytest.mark.slow  # a second Python process
def test_every_other_kernel_is_importable_and_raises_when_called(tmp_path: Path) -> None:
    site = _site(tmp_path)
    install_standin(site)
    probe = ("import sgl_kernel, sgl_kernel.kvcacheio as io\n"
             "from sgl_kernel import rmsnorm\n"
             "from sgl_kernel.scalar_type import scalar_types\n"
             "for fn in (rmsnorm, io.transfer_kv_per_layer, scalar_types.uint4b8):\n"
             "    try:\n        fn(1)\n    except sgl_kernel.StandInNotImplemented as e:\n        print(type(e).__name__)\n"
             "print(sgl_kernel.IS_WEIGHTSYNC_STANDIN, hasattr(sgl_kernel, '__wrapped__'))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["StandInNotImplemented"] * 3 + ["True", "False"]


META = '''import torch
import torchvision.extension  # noqa: F401


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets


@torch.library.register_fake("torchvision::qnms")
def meta_qnms(dets, scores, iou_threshold):
    return dets
'''


def test_the_torchvision_fix_guards_both_registrations_and_removes_the_extensions(tmp_path: Path) -> None:
    root = _site(tmp_path) / "torchvision"
    root.mkdir()
    (root / "_meta_registrations.py").write_text(META)
    for extension in ("_C.so", "image.so", "keep.so"):
        (root / extension).write_bytes(b"\0")
    installer = Installer("0.5.23", tmp_path / "v")
    installer.patch_torchvision()
    patched = (root / "_meta_registrations.py").read_text()
    assert patched.count("if torchvision.extension._has_ops() else (lambda fn: fn))") == 2
    assert sorted(p.name for p in root.glob("*.so")) == ["keep.so"]
    installer.patch_torchvision()  # idempotent
    assert (root / "_meta_registrations.py").read_text() == patched
    compile(patched, "_meta_registrations.py", "exec")


def test_the_torchvision_fix_fails_plainly_when_the_file_changed(tmp_path: Path) -> None:
    root = _site(tmp_path) / "torchvision"
    root.mkdir()
    (root / "_meta_registrations.py").write_text("import torch\n")
    with pytest.raises(InstallError, match="found 0 nms/qnms fake registrations"):
        Installer("0.5.23", tmp_path / "v").patch_torchvision()


@pytest.mark.slow  # a second Python process (the patch is process-wide)
@pytest.mark.parametrize("unpinned", ["1", None])
def test_the_environment_s_sitecustomize_unpins_host_memory_only_when_asked(unpinned: str | None) -> None:
    """SGLang's LoRA layers pin host memory, which torch refuses without an accelerator: with WEIGHTSYNC_UNPINNED=1
    the release environment's sitecustomize drops the pinning; without it torch is untouched (and refuses)."""
    from gpu.sglang_cpu import CPU_ENV, UNPINNED

    assert CPU_ENV.get("WEIGHTSYNC_UNPINNED") == "1"
    probe = (f"import runpy; runpy.run_path({str(UNPINNED)!r}); import torch\n"
             "t = torch.zeros(3, pin_memory=True)\n"
             "print(t.pin_memory() is t, torch.tensor([1, 2], pin_memory=True).tolist())")
    env = {k: v for k, v in os.environ.items() if k != "WEIGHTSYNC_UNPINNED"}
    if unpinned:
        env["WEIGHTSYNC_UNPINNED"] = unpinned
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    if unpinned:
        assert done.returncode == 0 and done.stdout.split() == ["True", "[1,", "2]"], done.stderr[-800:]
    else:
        assert done.returncode != 0 and "pin" in done.stderr.lower(), (done.stdout, done.stderr[-800:])
