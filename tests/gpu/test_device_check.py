"""The device check's pieces that run without a GPU (``DEVICE_CHECK_DEVICE=cpu``): the weight digests it compares,
and the launchers saying why they skip where their engine is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu
SCRIPT = Path(__file__).resolve().parents[2] / "gpu" / "scripts" / "device_check.py"


@pytest.fixture(scope="module")
def device_check(tmp_path_factory: pytest.TempPathFactory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DEVICE_CHECK_DEVICE", "cpu")
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    mp.undo()


def test_the_weight_digests_agree_for_every_served_dtype(device_check) -> None:
    assert device_check.DEVICE == "cpu"
    assert device_check.check_vllm_checksums() == {"bfloat16": "equal", "float16": "equal", "float32": "equal"}
    assert set(device_check.check_weight_values()) == {"torch.bfloat16", "torch.float16", "torch.float32"}


def test_a_launcher_whose_engine_is_missing_says_so(device_check, tmp_path: Path) -> None:
    for package, check in (("sglang", device_check.check_sglang), ("vllm", device_check.check_vllm)):
        if importlib.util.find_spec(package) is None:
            assert check(tmp_path) == {"skipped": f"{package} is not importable on this machine"}


def test_it_names_what_still_needs_a_cluster(device_check) -> None:
    text = " ".join(device_check.NEEDS_A_CLUSTER)
    assert "pytest -m gpu --nodes 2" in text and "vLLM's native weight transfer" in text
