"""What of the GPU path runs on one GPU machine with no internet and maybe no ``sglang``/``ray`` (see
``device_check.sh``). Each check is independent; a failing one is reported and the next one runs. Results:
``OUT/device_check.json`` (and the printed log).

Checks: the machine; the tiny model built and served by ``transformers`` on the GPU (config, weights, tokenizer
as a real engine loads them); the ``/get_weights_by_name`` value path (bf16 on the GPU → float32 list → exact
digest); vLLM's weight-checker digest of a GPU parameter against the suite's; the reference trainer's gloo broadcast
into CUDA tensors on an engine rank keyed like SGLang's (``init_custom_process_group``); NCCL on this GPU; and, when
importable, ``sglang.launch_server`` and vLLM's API server started by the supervisor with the GPU backend's launch
lines. It ends with what still needs a cluster. Fits ten minutes on one H100 (``device_check.sh``'s timeout).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DEVICE = os.environ.get("DEVICE_CHECK_DEVICE", "cuda")
"""``cpu`` runs the same checks without a GPU (how the script itself is tested)."""


def check_machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda_available": torch.cuda.is_available(), "gpus": torch.cuda.device_count()}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    import importlib.util

    info["importable"] = {m: importlib.util.find_spec(m) is not None
                          for m in ("sglang", "ray", "tokenizers", "transformers", "safetensors", "httpx", "uvicorn")}
    return info


def check_tiny_model(out: Path) -> dict[str, Any]:
    """Build the default tiny model, load it with transformers on the GPU, generate, and compare its parameters with
    what the checkpoint holds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gpu.tiny_model import write_model
    from gpu.weights import served_weights

    t0 = time.monotonic()
    model_dir = write_model(out / "tiny-model")
    built_s = time.monotonic() - t0
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(DEVICE).eval()
    prompt = "Prompt 0 (seed 0): solve the task and explain."
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(DEVICE)
    assert tokenizer.decode(ids[0], skip_special_tokens=True) == prompt, "the tokenizer round-trips the prompt"
    assert set(list(prompt.encode())) <= set(ids[0].tolist()), "byte-level: every byte of the prompt is a token"
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=16, do_sample=False)
    held = dict(model.named_parameters())
    disk = served_weights(model_dir)
    missing = sorted(set(disk) - set(held))
    differ = [n for n in disk if n in held and not torch.equal(held[n].detach().cpu(), disk[n])]
    assert not missing and not differ, f"missing {missing}, different {differ}"
    return {"built_s": round(built_s, 2), "parameters": len(disk), "numel": sum(t.numel() for t in disk.values()),
            "generated_tokens": generated.shape[1] - ids.shape[1], "dtype": str(next(model.parameters()).dtype)}


def check_weight_values() -> dict[str, Any]:
    """SGLang's ``get_weights_by_name`` answer (``param.to(float32).tolist()[:n]``) of a bf16 GPU parameter rebuilds
    its exact digest (``gpu.weights.blob_from_values``)."""
    import torch

    from fakes.weights import TensorBlob
    from gpu.weights import blob_from_values

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        param = (0.02 * torch.randn(256, 128, device=DEVICE, generator=gen)).to(dtype)
        t0 = time.monotonic()
        values = param.cpu().to(torch.float32).numpy().tolist()[: param.shape[0]]
        rebuilt = blob_from_values(values, str(dtype).removeprefix("torch."))
        assert rebuilt.digest() == TensorBlob.from_torch(param).digest(), f"{dtype}: digest differs"
        out[str(dtype)] = f"exact ({time.monotonic() - t0:.3f}s)"
    return out


def _engine_rank(port: int, group: str, shapes: list[list[int]], device: str, result: Any) -> None:
    """An engine's rank 1, joined as SGLang joins (``fakes.weights._make_gloo_group`` models it), receiving the
    broadcast into CUDA tensors as SGLang's ``update_weights_from_distributed`` does."""
    try:
        import torch
        import torch.distributed as dist

        from fakes.weights import _make_gloo_group

        pg, _ = _make_gloo_group("127.0.0.1", port, 1, 2, group, time.monotonic() + 60)
        got = []
        for shape in shapes:
            t = torch.empty(shape, dtype=torch.bfloat16, device=device)
            pg.broadcast([t], dist.BroadcastOptions()).wait(timedelta(seconds=60))
            got.append(t.cpu())
        result.put(("ok", got))
    except BaseException:
        result.put(("error", traceback.format_exc()))


def check_gloo_into_cuda() -> dict[str, Any]:
    """The reference trainer's rank 0 (``DistributedTransport``: TCPStore, SGLang's store keying, gloo) broadcasting
    to an engine rank that receives into CUDA tensors."""
    import torch
    import torch.distributed as dist

    from conformance.reference.transports import DistributedTransport

    transport = DistributedTransport("gloo", timeout_s=60)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    tensors = [torch.randn(64, 32).to(torch.bfloat16), torch.randn(300).to(torch.bfloat16)]
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    engine = ctx.Process(target=_engine_rank, args=(store.port, "device_check_group",
                                                    [list(t.shape) for t in tensors], DEVICE, result))
    engine.start()
    group = transport._new_group(store, "device_check_group", 2)
    t0 = time.monotonic()
    transport._broadcast(group, tensors)
    status, got = result.get(timeout=90)
    engine.join(30)
    assert status == "ok", got
    differ = [i for i, (sent, received) in enumerate(zip(tensors, got)) if not torch.equal(sent, received)]
    assert len(got) == len(tensors) and not differ, f"tensors {differ} arrived different"
    return {"tensors": len(tensors), "broadcast_s": round(time.monotonic() - t0, 3)}


def _nccl_rank(rank: int, world_size: int, port: int, result: Any) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=60))
        t = torch.arange(1024, device="cuda", dtype=torch.float32) if rank == 0 else torch.zeros(1024, device="cuda")
        dist.broadcast(t, src=0)
        torch.cuda.synchronize()
        ok = torch.equal(t.cpu(), torch.arange(1024, dtype=torch.float32))
        dist.destroy_process_group()
        result.put((rank, "ok" if ok else "wrong values"))
    except BaseException as exc:
        result.put((rank, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))


def _nccl_group(world_size: int) -> list[tuple[int, str]]:
    from gpu.engine import free_port

    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    port = free_port("127.0.0.1")
    procs = [ctx.Process(target=_nccl_rank, args=(r, world_size, port, result)) for r in range(world_size)]
    for p in procs:
        p.start()
    answers = sorted(result.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return answers


def check_nccl() -> dict[str, Any]:
    """NCCL on this GPU: a one-rank group broadcasts (the trainer's side of an NCCL weight update), and what NCCL
    answers to a trainer rank and an engine rank sharing this one device (on a cluster they sit on different
    GPUs; NCCL refuses two ranks on one GPU)."""
    one = _nccl_group(1)
    if one != [(0, "ok")]:
        raise RuntimeError(f"a one-rank NCCL group failed: {one}")
    return {"one_rank": one, "two_ranks_one_gpu": _nccl_group(2)}


def check_sglang(out: Path) -> dict[str, Any]:
    """``python -m sglang.launch_server ARGS`` (the fake's ARGS) under the supervisor: health, a generate, and every
    parameter's digest through ``/get_weights_by_name`` equal to the checkpoint's."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return {"skipped": "sglang is not importable on this machine"}
    import httpx

    from fakes.weights import TensorBlob
    from gpu.engine import EngineProcess
    from gpu.launch import SGLANG, EngineSpec
    from gpu.weights import parameter_specs, read_all_digests, served_weights

    model_dir = out / "tiny-model"
    engine = EngineProcess(EngineSpec(model_path=str(model_dir), enable_lora=True, mem_fraction_static=0.3),
                           SGLANG, name="sglang")
    t0 = time.monotonic()
    url = engine.start(health_timeout_s=240)
    try:
        started_s = time.monotonic() - t0
        r = httpx.post(url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 8}}, timeout=60)
        r.raise_for_status()
        weights = served_weights(model_dir)
        (digests,) = read_all_digests([url], parameter_specs(weights))
        expected = {n: TensorBlob.from_torch(t).digest() for n, t in weights.items()}
        differ = sorted(n for n in expected if digests.get(n) != expected[n])
        assert not differ, f"engine digests differ from the checkpoint for {differ[:5]}"
        return {"started_s": round(started_s, 1), "generate": r.json().get("meta_info", {}),
                "digests_equal": len(expected)}
    finally:
        engine.stop()
        (out / "sglang.log").write_text(engine.log_tail(200_000))


def check_vllm_checksums() -> dict[str, Any]:
    """vLLM's weight checker on a GPU parameter (sha256 of its bytes as held, ``compute_tensor_digests``,
    ``model_executor/model_loader/weight_checksum.py``, 0.32.0) equals the digest the suite computes from the
    trainer's CPU tensor (:func:`gpu.weights.raw_digests`), for every served dtype."""
    import hashlib

    import torch

    from gpu.weights import raw_digests

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        param = (0.02 * torch.randn(256, 128, device=DEVICE, generator=gen)).to(dtype)
        held = hashlib.sha256(param.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
        name = str(dtype).removeprefix("torch.")
        ours = raw_digests({"w": param.cpu()}, ["w"], {"w": (name, tuple(param.shape))})["w"]
        assert held == ours, f"{dtype}: the engine's checksum differs from the suite's digest"
        out[name] = "equal"
    return out


def check_vllm(out: Path) -> dict[str, Any]:
    """``python -m vllm.entrypoints.openai.api_server`` with the GPU backend's launch line (:data:`gpu.families.VLLM_REAL`:
    RL routes, runtime LoRA, the NCCL weight-transfer engine configured) under the supervisor: health, a completion,
    the label, and the weight checker's digests equal to the checkpoint's."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not importable on this machine"}
    import httpx

    from gpu.engine import EngineProcess
    from gpu.launch import VLLM, EngineSpec
    from gpu.families import VLLM_REAL
    from gpu.weights import checkpoint_view, in_thread, parameter_specs, raw_digests, read_checksums, served_weights

    launch, model_dir = VLLM_REAL, out / "tiny-model"
    spec = EngineSpec(model_path=str(model_dir), enable_lora=True,
                      extra_args=(*launch.flags, "--gpu-memory-utilization", "0.3"))
    engine = EngineProcess(spec, VLLM, env=launch.env, name="vllm")
    t0 = time.monotonic()
    url = engine.start(health_timeout_s=300)
    try:
        started_s = time.monotonic() - t0
        r = httpx.post(url + "/v1/completions", json={"model": str(model_dir), "prompt": "hello", "max_tokens": 8},
                       timeout=60)
        r.raise_for_status()
        label = httpx.get(url + "/weight_info", timeout=30).json()
        weights = served_weights(model_dir)
        shown = checkpoint_view(in_thread(read_checksums(url), 90), weights)
        expected = raw_digests(weights, shown, parameter_specs(weights))
        differ = sorted(n for n in shown if shown[n] != expected[n])
        assert shown and not differ, f"weight checker digests differ from the checkpoint for {differ[:5]}"
        return {"started_s": round(started_s, 1), "completion_tokens": r.json()["usage"]["completion_tokens"],
                "weight_info": label, "digests_equal": len(shown), "fused_or_unshown": len(weights) - len(shown)}
    finally:
        engine.stop()
        (out / "vllm.log").write_text(engine.log_tail(200_000))


NEEDS_A_CLUSTER = (
    "real SGLang and real vLLM engines on GPUs of two nodes under Ray (pytest -m gpu --nodes 2, each "
    "--conformance-engine), the aborted-sample rate of every scenario",
    "the NCCL transport between a trainer GPU and engine GPUs (NCCL refuses two ranks on one device: "
    "nccl.two_ranks_one_gpu)",
    "vLLM's native weight transfer (/init_weight_transfer_engine ... /finish_weight_update) between GPUs",
    "node loss on real nodes (simulated in CI: tests/gpu/test_ray_backend.py)",
)
"""What one GPU machine cannot show: printed, and kept in the result."""


def main(out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="device-check-"))
    checks: list[tuple[str, Callable[[], Any]]] = [
        ("machine", check_machine), ("tiny_model", lambda: check_tiny_model(work)),
        ("weight_values", check_weight_values), ("gloo_into_cuda", check_gloo_into_cuda), ("nccl", check_nccl),
        ("vllm_checksums", check_vllm_checksums), ("sglang_launcher", lambda: check_sglang(work)),
        ("vllm_launcher", lambda: check_vllm(work))]
    results: dict[str, Any] = {}
    for name, check in checks:
        t0 = time.monotonic()
        try:
            results[name] = {"status": "ok", "result": check()}
        except BaseException as exc:
            results[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.monotonic() - t0, 2)
        shown = {k: v for k, v in results[name].items() if k != "traceback"}
        print(f"[device-check] {name}: {json.dumps(shown, default=str)}", flush=True)
        (out / "device_check.json").write_text(json.dumps(results, indent=2, default=str))
    results["needs_a_cluster"] = {"status": "ok", "result": list(NEEDS_A_CLUSTER)}
    (out / "device_check.json").write_text(json.dumps(results, indent=2, default=str))
    for line in NEEDS_A_CLUSTER:
        print(f"[device-check] still needs a cluster: {line}", flush=True)
    failed = [n for n, r in results.items() if r["status"] != "ok"]
    print(f"[device-check] done: {len(results) - len(failed)} ok, failed: {failed or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python gpu/scripts/device_check.py OUT", file=sys.stderr)
        raise SystemExit(2)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main(sys.argv[1]))
