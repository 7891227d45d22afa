"""The fake's behaviours fixed after ``python -m gpu.fidelity`` measured real SGLang disagreeing (CPU, the PyPI
wheels): each test states what real SGLang answered."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import httpx
import pytest

from fakes.engine import FakeEngine
from gpu.engine import free_port

pytestmark = pytest.mark.cpu


@pytest.mark.asyncio
async def test_text_and_input_ids_together_generate_from_the_input_ids(connect, profile_version: str) -> None:
    # real 0.5.15/0.5.23: 200 (GenerateReqInput._validate_inputs refuses only none or all three of text/input_ids/
    # input_embeds; _tokenize_one_request takes the input_ids)
    wire = await connect(FakeEngine(profile_version, tokens_per_second=1000.0))
    both = await wire.post("/generate", json={"text": "a longer text", "input_ids": [1, 2],
                                              "sampling_params": {"max_new_tokens": 2}})
    assert both.status_code == 200
    assert both.json()["meta_info"]["prompt_tokens"] == 2


@pytest.mark.slow  # a second Python process
def test_the_drop_in_server_exits_when_its_engine_crashes() -> None:
    # real 0.5.15: an unknown group's assert kills the scheduler; the call gets no answer, the server exits
    port = free_port("127.0.0.1")
    server = subprocess.Popen([sys.executable, "-m", "fakes.launch_server", "--model-path", "fake-sglang/tiny-llama",
                               "--port", str(port), "--fake-profile", "0.5.15"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "the fake did not start"
            time.sleep(0.05)
        with pytest.raises(httpx.TransportError):
            httpx.post(f"http://127.0.0.1:{port}/update_weights_from_distributed", timeout=30, json={
                "names": ["w"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "nope"})
        assert server.wait(30) == 1
        assert "Scheduler hit an exception: AssertionError: Group nope not in []" in server.stderr.read()
    finally:
        server.kill()
        server.wait(10)


@pytest.mark.asyncio
async def test_meta_info_carries_the_cache_breakdown_and_the_send_time_from_0_5_10(connect,
                                                                                    profile_version: str) -> None:
    # real 0.5.10/0.5.15/0.5.23: cached_tokens_details and dp_rank null in every output; the first output sent
    # (here the only one) carries response_sent_to_client_ts; 0.5.4's tokenizer manager has none of them
    wire = await connect(FakeEngine(profile_version, tokens_per_second=1000.0))
    before = time.time()
    meta = (await wire.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}))
    meta = meta.json()["meta_info"]
    if profile_version == "0.5.4":
        assert not {"cached_tokens_details", "dp_rank", "response_sent_to_client_ts"} & set(meta)
        return
    assert meta["cached_tokens_details"] is None and meta["dp_rank"] is None
    assert before <= meta["response_sent_to_client_ts"] <= time.time()


@pytest.mark.asyncio
async def test_model_info_has_the_embedding_plan_on_0_5_23(connect, profile_version: str) -> None:
    wire = await connect(FakeEngine(profile_version))
    info = (await wire.get("/get_model_info")).json()
    assert ("embedding" in info) == (profile_version == "0.5.23")
    if "embedding" in info:
        assert info["embedding"]["enabled"] is False and info["embedding"]["family"] == "none"
