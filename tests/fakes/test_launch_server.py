"""`python -m fakes.launch_server`: SGLang's launch flags (per release snapshot), readiness as SGLang shows it."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from fakes import launch_server
from fakes.engine import FakeEngine
from fakes.served_model import BUILTIN_MODEL_PATH
from fakes.weights import TensorBlob, save_checkpoint, save_lora_adapter, tiny_lora

pytestmark = pytest.mark.cpu

REPO = Path(__file__).resolve().parents[2]
KEY = {"Authorization": "Bearer k"}
START_TIMEOUT = 20.0


def _run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        launch_server.main(list(argv))
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model-path", BUILTIN_MODEL_PATH, "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        ([], "the following arguments are required: --model-path/--model"),
        (["--model-path", "/nonexistent/model"], "is not a local directory"),
        (["--model-path", BUILTIN_MODEL_PATH, "--tp-size", "two"], "argument --tp-size/--tensor-parallel-size: "
                                                                    "invalid int value: 'two'"),
        (["--model-path", BUILTIN_MODEL_PATH, "--fake-faults", '[{"bad": 1}]'], "unknown field(s) 'bad'"),
        (["--model-path", BUILTIN_MODEL_PATH, "--lora-paths", '{"lora_name": "a"}'], "'lora_name' and 'lora_path'"),
        (["--model-path", BUILTIN_MODEL_PATH, "--fake-tokens-per-second", "0"], "must be > 0"),
        # a flag of a later release is unknown to an earlier one (--dcp-size arrived after 0.5.10)
        (["--model-path", BUILTIN_MODEL_PATH, "--fake-profile", "0.5.10", "--dcp-size", "2"],
         "unrecognized arguments: --dcp-size 2"),
    ],
)
def test_bad_launch_flags_are_one_line_usage_errors(capsys, argv, message) -> None:
    code, err = _run_main(capsys, *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_every_snapshot_flag_parses_and_gpu_flags_are_ignored() -> None:
    assert launch_server.build_parser("0.5.15").parse_args(["--model", "/m", "--dcp-size", "2"]).dcp_size == 2
    for profile in ("0.5.4", "0.5.10", "0.5.15", "0.5.23"):
        parser = launch_server.build_parser(profile)
        args = parser.parse_args(["--model", "/m", "--tensor-parallel-size", "4", "--mem-fraction-static", "0.7",
                                  "--disable-cuda-graph", "--enable-lora", "--lora-paths", "a=/x", "b",
                                  '{"lora_name": "c", "lora_path": "/c", "pinned": true}', "--port", "31000"])
        assert (args.model_path, args.port, args.enable_lora) == ("/m", 31000, True)
        assert launch_server.lora_refs(args.lora_paths) == [("a", "/x", False), ("b", "b", False), ("c", "/c", True)]
        help_text = parser.format_help()
        assert "[honoured: the model served" in help_text and "[accepted, ignored by the fake]" in help_text
        # every flag of the release is registered (aliases too), and nothing else but -h and the --fake-* options
        snapshot_flags = {f for o in launch_server.server_args_snapshot(profile)["options"] for f in o["flags"]}
        registered = {f for a in parser._actions for f in a.option_strings}
        extra = {f for f in registered - snapshot_flags if not f.startswith(("--fake-", "--no-"))}
        assert snapshot_flags <= registered and extra == {"-h", "--help"}, extra


@pytest.mark.asyncio
async def test_health_is_503_until_the_warmup_succeeded(connect) -> None:
    engine = FakeEngine(starting=True)
    wire = await connect(engine)
    assert (await wire.get("/health")).status_code == 503
    engine.server_status = "Up"
    (resp,) = await wire.step_until_done([wire.spawn("GET", "/health")])
    assert resp.status_code == 200


@pytest.mark.slow  # a second Python process
def test_launch_serves_the_model_dir_then_sigterm_exits_zero(tmp_path: Path) -> None:
    """A framework's launcher: start with SGLang flags, wait for the readiness line, use it, SIGTERM."""
    model = {"model.embed_tokens.weight": TensorBlob.from_values("bfloat16", (8, 4), [0.5] * 32),
             "lm_head.weight": TensorBlob.from_values("bfloat16", (8, 4), [0.25] * 32)}
    save_lora_adapter(str(tmp_path / "lora"), tiny_lora(0))
    save_checkpoint(str(tmp_path), model, config={"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                                                  "torch_dtype": "bfloat16"})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fakes.launch_server", "--model-path", str(tmp_path), "--port", "0", "--host",
         "127.0.0.1", "--tp-size", "1", "--mem-fraction-static", "0.8", "--weight-version", "v0",
         "--served-model-name", "policy", "--fake-tokens-per-second", "2000", "--max-lora-rank", "8",
         "--lora-paths", f"sql={tmp_path / 'lora'}", "--api-key", "k"],
        cwd=REPO, env=env, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in iter(proc.stderr.readline, ""):
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    try:
        while not any(launch_server.READY_LINE in line for line in seen):
            line = lines.get(timeout=START_TIMEOUT)
            assert line is not None, f"exited {proc.poll()} before ready: {''.join(seen)}"
            seen.append(line)
        text = "".join(seen)
        assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!$", text,
                         re.M), text
        url = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", text).group(1)
        assert requests.get(url + "/health", timeout=10).status_code == 200  # probes need no --api-key
        assert requests.get(url + "/get_model_info", timeout=10).status_code == 401
        info = requests.get(url + "/get_model_info", timeout=10, headers=KEY).json()
        assert (info["model_path"], info["weight_version"], info["architectures"]) == (
            str(tmp_path), "v0", ["Qwen2ForCausalLM"])
        assert info["served_model_name"] == "policy"
        models = requests.get(url + "/v1/models", timeout=10, headers=KEY).json()["data"]  # --lora-paths loaded at startup
        assert [(m["id"], m["parent"]) for m in models] == [("policy", None), ("sql", "policy")]
        server_info = requests.get(url + "/get_server_info", timeout=10, headers=KEY).json()
        assert server_info["mem_fraction_static"] == 0.8 and server_info["tp_size"] == 1
        weights = requests.post(url + "/get_weights_by_name", json={"name": "lm_head.weight"}, timeout=10, headers=KEY).json()
        assert weights[0] == [0.25] * 4
        resp = requests.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path)}, timeout=10, headers=KEY)
        assert resp.status_code == 200 and resp.json()["success"] is True, resp.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert proc.stdout.read() == ""  # SGLang logs to stderr; stdout stays clean
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()
    assert "Traceback" not in "".join(seen) + json.dumps(None)
