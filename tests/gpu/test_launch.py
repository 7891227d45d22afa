"""The launch line: built in one place, identical for SGLang and the fake, and parsed by every SGLang release's own
``ServerArgs`` (rebuilt from the snapshots in ``fakes/snapshots``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from gpu.families import launch_command
from gpu.launch import FAKE, LORA_TARGET_MODULES, SGLANG, EngineSpec, launch_args

pytestmark = pytest.mark.cpu
SNAPSHOTS = sorted((Path(__file__).resolve().parents[2] / "fakes" / "snapshots").glob("server_args-*.json"))


def test_the_args_carry_the_model_the_address_and_the_scenario_needs() -> None:
    spec = EngineSpec(model_path="/models/tiny", enable_lora=True, max_lora_rank=4, weight_version="v0",
                      max_running_requests=32, random_seed=7, mem_fraction_static=0.3)
    assert launch_args(spec, "10.0.0.5", 31000) == [
        "--model-path", "/models/tiny", "--host", "10.0.0.5", "--port", "31000",
        "--enable-lora", "--max-lora-rank", "4", "--lora-target-modules", *LORA_TARGET_MODULES,
        "--weight-version", "v0", "--max-running-requests", "32", "--random-seed", "7",
        "--mem-fraction-static", "0.3", "--disable-cuda-graph"]


def test_lora_is_off_unless_asked_and_extra_args_pass_through() -> None:
    args = launch_args(EngineSpec(model_path="m", disable_cuda_graph=False, extra_args=("--log-level", "warning")),
                       "127.0.0.1", 1)
    assert args == ["--model-path", "m", "--host", "127.0.0.1", "--port", "1", "--log-level", "warning"]


def test_sglang_and_the_fake_get_the_same_args_and_only_the_fake_its_own_flags() -> None:
    spec = EngineSpec(model_path="/m", enable_lora=True, fake_args=("--fake-tokens-per-second", "500"))
    real = launch_command(spec, "127.0.0.1", 30000, SGLANG, python="py")
    fake = launch_command(spec, "127.0.0.1", 30000, FAKE, python="py")
    assert real[:3] == ["py", "-m", "sglang.launch_server"] and fake[:3] == ["py", "-m", "fakes.launch_server"]
    assert fake[3:] == real[3:] + ["--fake-tokens-per-second", "500"]
    assert not any(a.startswith("--fake") for a in real)
    assert launch_command(spec, "h", 1)[0] == sys.executable


@pytest.mark.parametrize(("spec", "port", "error"), [
    (EngineSpec(model_path=""), 30000, "model_path is empty"),
    (EngineSpec(model_path="/m"), 0, "port 0 is out of range"),
    (EngineSpec(model_path="/m"), 70000, "port 70000 is out of range"),
])
def test_bad_input_is_a_clear_error(spec: EngineSpec, port: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        launch_args(spec, "127.0.0.1", port)


def server_args_parser(snapshot: Path) -> argparse.ArgumentParser:
    """SGLang's launch parser of one release, rebuilt from its ``ServerArgs`` snapshot (flags, arity, choices)."""
    parser = argparse.ArgumentParser(prog=snapshot.stem, exit_on_error=False, add_help=False)
    for option in json.loads(snapshot.read_text())["options"]:
        kwargs: dict = {"dest": option["dest"]}
        if option["nargs"] == 0:  # store_true and SGLang's deprecated/boolean flag actions
            kwargs["action"] = "store_false" if option["action"] == "store_false" else "store_true"
        else:
            kwargs["nargs"] = option["nargs"]
            if option["choices"] and all(isinstance(c, str) for c in option["choices"]):
                kwargs["choices"] = option["choices"]
        parser.add_argument(*option["flags"], **kwargs)
    return parser


def test_there_are_snapshots_of_the_releases_to_check_against() -> None:
    assert {p.stem for p in SNAPSHOTS} >= {"server_args-0.5.4", "server_args-0.5.10", "server_args-0.5.23"}


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
def test_every_sglang_release_parses_the_args(snapshot: Path) -> None:
    spec = EngineSpec(model_path="/m", enable_lora=True, weight_version="v0", max_running_requests=8,
                      random_seed=1, mem_fraction_static=0.5)
    parsed = server_args_parser(snapshot).parse_args(launch_args(spec, "127.0.0.1", 30000))
    assert (parsed.model_path, parsed.host, parsed.port) == ("/m", "127.0.0.1", "30000")
    assert parsed.enable_lora and parsed.lora_target_modules == list(LORA_TARGET_MODULES)
    assert parsed.disable_cuda_graph and parsed.weight_version == "v0"
