"""``python -m fakes.vllm.launch_server --model DIR [--host H] [--port P] ...``: the fake vLLM as a drop-in for
``python -m vllm.entrypoints.openai.api_server`` (the flags a weight-sync test launches it with; the others vLLM
takes are accepted and ignored: they tune kernels and memory the fake has none of).

Fake-only flags: ``--fake-release`` (the vLLM release to behave as), ``--fake-tokens-per-second`` (decode speed),
``--fake-seed``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Sequence

from ..facts import VLLM
from .logprobs import MAX_LOGPROBS
from .prefix_cache import BLOCK_SIZE

if TYPE_CHECKING:
    from .engine import FakeVLLMEngine

READY_LINE = "Application startup complete."
"""What vLLM's uvicorn logs once it serves (a launcher may wait for it)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fakes.vllm.launch_server",
                                     description="The fake vLLM server (drop-in for vllm.entrypoints.openai."
                                                 "api_server).")
    parser.add_argument("--model", default=None,
                        help="the model directory served (default: the fake's built-in tiny model)")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--data-parallel-size", type=int, default=1,
                        help="engine cores behind the server, each with its own requests and prefix cache")
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--enable-scale-out", action="store_true")
    parser.add_argument("--max-logprobs", type=int, default=MAX_LOGPROBS)
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--enable-prompt-tokens-details", action="store_true")
    parser.add_argument("--weight-transfer-config", default=None,
                        help='vLLM\'s weight transfer engine, JSON: the fake serves {"backend": "gloo"}')
    for flag in ("--enforce-eager", "--disable-log-requests", "--disable-log-stats", "--trust-remote-code"):
        parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in ("--dtype", "--max-loras", "--gpu-memory-utilization", "--tensor-parallel-size",
                 "--seed", "--uvicorn-log-level"):
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fake-release", choices=VLLM.releases, default=VLLM.default_release)
    parser.add_argument("--fake-tokens-per-second", type=float, default=1000.0)
    parser.add_argument("--fake-seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.fake_tokens_per_second <= 0:
        parser.error(f"--fake-tokens-per-second must be > 0, got {args.fake_tokens_per_second}")
    from ..served_model import BUILTIN_MODEL_PATH, ModelPathError, builtin_model, load_served_model
    from ..serving import bind_loopback, run, serve_apps
    from .engine import FakeVLLMEngine

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        builtin = args.model in (None, BUILTIN_MODEL_PATH)
        model = builtin_model(args.fake_seed) if builtin else load_served_model(args.model, seed=args.fake_seed)
    except ModelPathError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    try:
        engine = FakeVLLMEngine(args.fake_release, model=model, model_path=None if builtin else args.model,
                                served_model_name=args.served_model_name, tokens_per_second=args.fake_tokens_per_second,
                                seed=args.fake_seed, max_num_seqs=args.max_num_seqs, enable_lora=args.enable_lora,
                                enable_scale_out=args.enable_scale_out, max_model_len=args.max_model_len,
                                max_lora_rank=args.max_lora_rank, max_logprobs=args.max_logprobs,
                                weight_transfer_config=args.weight_transfer_config, block_size=args.block_size,
                                enable_prefix_caching=args.enable_prefix_caching,
                                enable_prompt_tokens_details=args.enable_prompt_tokens_details,
                                data_parallel_size=args.data_parallel_size)
    except ValueError as e:  # an unknown weight-transfer backend: vLLM's factory stops the start-up
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    try:
        sock = bind_loopback(args.host, args.port)
    except OSError as e:
        parser.exit(2, f"{parser.prog}: error: cannot bind {args.host}:{args.port}: {e.strerror or e}\n")

    async def ready() -> None:
        logging.getLogger(__name__).info(READY_LINE)

    async def serve() -> None:
        stop = asyncio.Event()
        engine.app.on_engine_dead = stop.set
        watchdog = asyncio.ensure_future(watch(engine, stop, VLLM.fact("engine_death_ends_server", args.fake_release)))
        try:
            await serve_apps([engine.app], [sock], stop=stop, on_listening=ready, on_close=[engine.aclose])
        finally:
            watchdog.cancel()
    return run(serve())


async def watch(engine: FakeVLLMEngine, stop: asyncio.Event, every_s: float) -> None:
    """vLLM's ``watchdog_loop``: every ``every_s`` seconds, a crashed engine shuts the server down (fact
    ``engine_death_ends_server``: a death no request met, e.g. one in a streamed answer, ends the server too)."""
    while not engine.crashed:
        await asyncio.sleep(every_s)
    logging.getLogger(__name__).error("the engine core died: shutting the API server down")
    stop.set()


if __name__ == "__main__":
    raise SystemExit(main())
