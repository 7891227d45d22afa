"""`python -m fakes.launch_server ARGS`: one fake engine per process, started with SGLang's own launch flags.

A drop-in for `python -m sglang.launch_server ARGS`: the parser is built from the release's `ServerArgs` snapshot
(`snapshots/server_args-<profile>.json`, made by `scripts/snapshot_server_args.py` from the wheel), so every flag
that release accepts is accepted (same option strings, aliases, arity, int/float types, literal choices) and an
unknown flag is an error, as in SGLang. Flags that change the weight-sync surface are honoured (`HONOURED`);
every other flag only tunes GPUs, kernels or deployment and is accepted and ignored (`--help` says so per flag).

Like SGLang's server it answers `/health` 503 until its warmup `/generate` succeeded, then logs
"The server is fired up and ready to roll!" (stderr, SGLang's log format), so a framework's launcher that polls
`/health` or waits for that line starts it unchanged. SIGINT/SIGTERM stop it (exit 0).

Fake-only flags, namespaced so they never collide with SGLang's: `--fake-profile` (which release to behave as, and
whose flags to accept), `--fake-tokens-per-second`, `--fake-seed`, `--fake-faults`, `--fake-strict-weights`.

    python -m fakes.launch_server --model-path /ckpt/step0 --port 30000 --enable-lora --fake-profile 0.5.15
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .cli import UsageParser, exit_on_crash, fault_plan_factory
from .profiles import DEFAULT_PROFILE, PROFILES

SNAPSHOT_DIR = Path(__file__).parent / "snapshots"
READY_LINE = "The server is fired up and ready to roll!"  # http_server._wait_and_warmup
LOG_FORMAT = "[%(asctime)s] %(message)s"  # utils.common.configure_logger
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"

#: ServerArgs fields (argparse dests) the fake acts on; every other flag is accepted and ignored.
HONOURED: dict[str, str] = {
    "model_path": "the model served: a local model directory, or fake-sglang/tiny-llama (built-in)",
    "tokenizer_path": "reported by /get_model_info and /get_server_info",
    "skip_tokenizer_init": "text prompts are rejected (input_ids only), as in SGLang",
    "host": "the interface to bind",
    "port": "the port to bind (0: the OS picks; the log line names it)",
    "enable_lora": "accept LoRA adapter loads",
    "lora_paths": "adapters loaded at startup (<PATH> | <NAME>=<PATH> | JSON with lora_name, lora_path, pinned)",
    "max_loaded_loras": "LoRA adapters held at once (LRU eviction of unpinned ones; default: no limit)",
    "max_lora_rank": "adapters of a larger rank are refused",
    "lora_target_modules": "adapters targeting other modules are refused",
    "weight_version": "the initial weight version label",
    "max_running_requests": "the running-batch capacity of the scheduler (default 64 in the fake)",
    "dtype": "the dtype floating-point parameters are held in (resolved as SGLang resolves it)",
    "load_format": "the load format reported by /get_model_info and used to read --model-path",
    "served_model_name": "the model name of /get_model_info and /v1/models",
    "random_seed": "the seed of weights, request ids and faults (unless --fake-seed)",
    "enable_memory_saver": "/release_memory_occupation really releases: weights and KV cache hold nothing until "
                           "resumed (a forward pass meanwhile crashes)",
    "enable_weights_cpu_backup": "resumed weights are the released ones (else zeros: push weights again)",
    "context_length": "max_model_len of /v1/models (default: config.json max_position_embeddings)",
    "tp_size": "TP ranks: each joins a weight-update group as rank_offset + tp_rank, one tensor payload item each",
    "tensor_parallel_size": "as --tp-size (its dest in older SGLang releases)",
    "api_key": "every route but /health*, /ready and /metrics needs Authorization: Bearer <key> (401 otherwise)",
}


# ----------------------------------------------------------------------------------------------- the parser


def server_args_snapshot(profile: str) -> dict[str, Any]:
    """The committed `ServerArgs` snapshot of a profile (the newest not newer than it)."""
    from .facts import newest_not_newer, parse_version

    labels = sorted((p.name[len("server_args-"):-len(".json")] for p in SNAPSHOT_DIR.glob("server_args-*.json")),
                    key=parse_version)
    chosen = newest_not_newer(labels, profile)
    if chosen is None:
        raise FileNotFoundError(f"no server_args snapshot for SGLang {profile}; have {labels}")
    return json.loads((SNAPSHOT_DIR / f"server_args-{chosen}.json").read_text())


class _Deprecated(argparse.Action):
    """SGLang's `DeprecatedAction`: a retired flag; with an `error_message` the launch stops with it."""

    def __init__(self, option_strings: list[str], dest: str, error_message: str | None = None,
                 nargs: Any = 0, **kwargs: Any) -> None:
        self.error_message = error_message
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        if self.error_message:
            parser.error(self.error_message)
        logging.getLogger(__name__).warning("The command line argument '%s' is deprecated.", option)


_TYPES = {"int": int, "float": float}


def _add_option(parser: argparse.ArgumentParser, option: dict[str, Any]) -> None:
    """Register one snapshot option the way SGLang's `add_cli_args` registers it (values kept, not acted on)."""
    dest, action = option["dest"], option["action"]
    flags = option["flags"]
    note = HONOURED.get(dest)
    help_text = str(option.get("help") or "").replace("%", "%%")
    help_text = f"[honoured: {note}] {help_text}" if note else f"[accepted, ignored by the fake] {help_text}"
    kwargs: dict[str, Any] = {"dest": dest, "help": help_text}
    default = option.get("default")
    kwargs["default"] = None if isinstance(default, dict) else default
    if action in ("store_true", "DeprecatedStoreTrueAction"):
        parser.add_argument(*flags, action="store_true", **kwargs)
    elif action == "store_false":
        parser.add_argument(*flags, action="store_false", **kwargs)
    elif action == "BooleanOptionalAction":
        parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **kwargs)
    elif action == "DeprecatedAction":
        parser.add_argument(*flags, action=_Deprecated, error_message=option.get("error_message"),
                            nargs=option.get("nargs") or 0, **kwargs)
    elif action in ("store_const", "DeprecatedStoreConstAction") and option.get("nargs") == 0:
        const = option.get("const_value", option.get("const"))
        parser.add_argument(*flags, action="store_const", const=const, **kwargs)
    elif action == "count":
        parser.add_argument(*flags, action="count", **kwargs)
    else:  # store, LoRAPathAction (nargs "*"), DeprecatedAliasStoreAction, a valued DeprecatedStoreConstAction
        value_type = _TYPES.get(option.get("type") or "", str)
        choices = option.get("choices")
        if choices is not None:
            kwargs["choices"] = [value_type(c) if not isinstance(c, (list, dict)) else c for c in choices]
        if option.get("nargs") is not None:
            kwargs["nargs"] = option["nargs"]
        if option.get("required"):
            kwargs["required"] = True
        parser.add_argument(*flags, type=value_type, **kwargs)


def _add_fake_options(parser: argparse.ArgumentParser) -> None:
    fake = parser.add_argument_group("fake-only options (never SGLang flags)")
    fake.add_argument("--fake-profile", default=DEFAULT_PROFILE, choices=list(PROFILES),
                      help=f"the SGLang release to behave as, and whose launch flags to accept (default "
                           f"{DEFAULT_PROFILE})")
    fake.add_argument("--fake-tokens-per-second", type=float, default=100.0, metavar="R",
                      help="decode speed of every request (default 100)")
    fake.add_argument("--fake-seed", type=int, default=None, metavar="S",
                      help="seed of weights, request ids and faults (default: --random-seed, else 0)")
    fake.add_argument("--fake-faults", default=None, metavar="JSON",
                      help='a fault plan, a JSON list of Fault fields, e.g. '
                           '\'[{"endpoint": "/flush_cache", "kind": "flush_fail", "times": 1}]\'')
    fake.add_argument("--fake-strict-weights", action="store_true",
                      help="refuse updates naming parameters the model lacks and partial sharded checkpoints "
                           "(SGLang skips the unknown names with a warning and loads what is there)")


def build_parser(profile: str = DEFAULT_PROFILE) -> argparse.ArgumentParser:
    """The launch-flag parser of SGLang `profile` plus the fake-only `--fake-*` options."""
    parser = UsageParser(
        prog=f"python -m {__package__ or 'fakes'}.launch_server",
        usage="%(prog)s --model-path PATH [SGLang launch flags] [--fake-* options]",
        description=f"A fake SGLang server (profile {profile}), started with SGLang's launch flags. Flags marked "
                    "[honoured] change what the fake does; the others are accepted and ignored.",
    )
    _add_fake_options(parser)
    for option in server_args_snapshot(profile)["options"]:
        _add_option(parser, option)
    return parser


def _profile_of(argv: Sequence[str]) -> str:
    """`--fake-profile` read ahead (it chooses the flags the full parser accepts)."""
    pre = UsageParser(add_help=False, prog=f"python -m {__package__ or 'fakes'}.launch_server")
    pre.add_argument("--fake-profile", default=DEFAULT_PROFILE, choices=list(PROFILES))
    return pre.parse_known_args(list(argv))[0].fake_profile


def lora_refs(paths: Sequence[Any] | None) -> list[tuple[str, str, bool]]:
    """`--lora-paths` entries (SGLang's `LoRAPathAction` + `ServerArgs` normalisation) → (name, path, pinned)."""
    refs = []
    for item in paths or []:
        item = item.strip() if isinstance(item, str) else item
        if isinstance(item, str) and item.startswith("{") and item.endswith("}"):
            item = json.loads(item)
        if isinstance(item, dict):
            if "lora_name" not in item or "lora_path" not in item:
                raise ValueError(f"{item!r} does not contain 'lora_name' and 'lora_path' keys")
            refs.append((str(item["lora_name"]), str(item["lora_path"]), bool(item.get("pinned", False))))
        elif "=" in item:
            name, path = item.split("=", 1)
            refs.append((name, path, False))
        else:
            refs.append((item, item, False))
    return refs


# ----------------------------------------------------------------------------------------------- serving


def make_engine(args: argparse.Namespace, faults: Any = None) -> Any:
    """The FakeEngine the parsed launch flags describe (raises ModelPathError for a bad --model-path)."""
    from .engine import FakeEngine
    from .served_model import load_served_model

    seed = args.fake_seed if args.fake_seed is not None else (args.random_seed or 0)
    model = load_served_model(args.model_path, args.dtype or "auto", args.load_format, seed)
    server_args = {k: v for k, v in vars(args).items() if not k.startswith("fake_")}
    return FakeEngine(
        profile=args.fake_profile,
        tokens_per_second=args.fake_tokens_per_second,
        max_running_requests=args.max_running_requests or 64,
        enable_lora=bool(args.enable_lora or args.lora_paths),
        max_loras=args.max_loaded_loras,  # None: SGLang keeps every loaded adapter
        seed=seed,
        faults=faults(seed) if faults else None,
        weight_version=args.weight_version or "default",
        model=model,
        tokenizer_path=args.tokenizer_path,
        served_model_name=args.served_model_name,
        skip_tokenizer_init=bool(args.skip_tokenizer_init),
        max_lora_rank=args.max_lora_rank,
        lora_target_modules=args.lora_target_modules,
        load_format=args.load_format or "auto",
        strict_weights=args.fake_strict_weights,
        enable_memory_saver=bool(args.enable_memory_saver),
        enable_weights_cpu_backup=bool(args.enable_weights_cpu_backup),
        context_length=args.context_length,
        tp_size=getattr(args, "tp_size", None) or getattr(args, "tensor_parallel_size", None) or 1,
        api_key=args.api_key,
        server_args=server_args,
        starting=True,
    )


async def serve(args: argparse.Namespace, engine: Any, sock: Any) -> int:
    """Serve `engine` on `sock` until SIGINT/SIGTERM: warm up, then log the readiness line."""
    import asyncio
    import urllib.request

    from .serving import http_url, serve_apps

    log = logging.getLogger(__name__)
    url = http_url(args.host, sock.getsockname()[1])

    async def warm_up() -> None:
        log.info("Uvicorn running on %s (Press CTRL+C to quit)", url)
        for name, path, pinned in lora_refs(args.lora_paths):
            reply = await engine.load_lora_adapter({"lora_name": name, "lora_path": path, "pinned": pinned})
            if reply.status != 200:
                raise RuntimeError(f"--lora-paths {name}={path}: {reply.body['error_message']}")
        body: dict[str, Any] = {"sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        if args.skip_tokenizer_init:
            body["input_ids"] = [10, 11, 12]
        else:
            body["text"] = "The capital city of France is"
        headers = {"Content-Type": "application/json"}
        if args.api_key:  # _execute_server_warmup sends the key
            headers["Authorization"] = f"Bearer {args.api_key}"
        request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), headers=headers)

        def post() -> int:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return resp.status

        status = await asyncio.to_thread(post)
        if status != 200:
            raise RuntimeError(f"warmup /generate answered {status}")
        engine.server_status = "Up"
        log.info(READY_LINE)

    await serve_apps([engine.app], [sock], on_listening=warm_up, on_close=[engine.aclose])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_profile_of(argv))
    args = parser.parse_args(argv)
    faults = fault_plan_factory(parser, "--fake-faults", args.fake_faults) if args.fake_faults else None
    if args.fake_tokens_per_second <= 0:
        parser.error(f"--fake-tokens-per-second must be > 0, got {args.fake_tokens_per_second}")
    try:
        lora_refs(args.lora_paths)
    except ValueError as e:
        parser.error(f"--lora-paths: {e}")
    from .served_model import ModelPathError
    from .serving import bind_loopback, run

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, datefmt=LOG_DATEFMT, stream=sys.stderr)
    try:
        engine = make_engine(args, faults)
    except ModelPathError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    engine.on_crash = exit_on_crash
    try:
        sock = bind_loopback(args.host, args.port)
    except OSError as e:
        parser.exit(2, f"{parser.prog}: error: cannot bind {args.host}:{args.port}: {e.strerror or e}\n")
    return run(serve(args, engine, sock))


if __name__ == "__main__":
    raise SystemExit(main())
