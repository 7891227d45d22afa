"""``python -m gpu.fidelity --release V``: the fidelity script on the fake and on real SGLang, diffed
(``--engine vllm --release V``: the vLLM script on the fake vLLM and on real vLLM, :mod:`gpu.fidelity.vllm`).

Both engines are started with the same launch line (:data:`gpu.sglang_cpu.CPU_FLAGS`), the fake as the drop-in
``python -m fakes.launch_server`` with ``--fake-profile RELEASE``, real SGLang from the release's CPU environment
(``python -m gpu.sglang_cpu install``). Every divergence is printed with both answers and compared with the
committed list ``gpu/fidelity/divergences-RELEASE.json`` (each entry explained): exit 0 when they match, 1 on a
divergence not listed or a listed one that no longer happens, 2 on bad input or an environment that is missing.
Each entry has a ``class`` (``fake-only``, ``CPU artefact``, ``not modelled``, ``race``) and its explanation (``why``); a
``race`` is one of the answers real SGLang gives run to run, so its absence is no change.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from fakes.facts import SGLANG as SGLANG_FACTS
from gpu.engine import EXIT_WAIT_S, EngineProcess, EngineStartError
from gpu.launch import FAKE, SGLANG, EngineSpec
from gpu.sglang_cpu import CPU_ENV, CPU_FLAGS, CPU_LORA_FLAGS, RELEASES, python_of, status

from .coverage import UNCOVERED
from .lists import CLASSES, command_line, compare, is_race, key  # noqa: F401  (CLASSES: read by the tests from here too)
from .lifetimes import EXITED, LIFETIMES, MATRIX, lost, run_script
from .script import Sent, diff

HERE = Path(__file__).resolve().parent
START_TIMEOUT_S = 240.0


def divergences_file(release: str) -> Path:
    return HERE / f"divergences-{release}.json"


def known(release: str) -> list[dict[str, Any]]:
    """The committed divergences of ``release`` (each with ``why``)."""
    path = divergences_file(release)
    return json.loads(path.read_text())["divergences"] if path.exists() else []


OTHER_FAMILIES = ("fakes/vllm/", "fakes/facts/vllm.py")
"""The fake vLLM's sources: no part of the fake SGLang, so no change to them makes an SGLang list stale."""


def script_digest() -> str:
    """The digest of what a list was measured with: the fidelity script, its state matrix and malformed bodies, its
    lifetimes and the fake SGLang's sources (its modules, the facts table, the snapshots; not another family's fake,
    :data:`OTHER_FAMILIES`). A list measured with another script compares other steps; with another fake, other
    answers."""
    import hashlib

    root = HERE.parent.parent
    sources = [HERE / "script.py", HERE / "matrix.py", HERE / "malformed.py", HERE / "lifetimes.py",
               *sorted(p for p in (root / "fakes").rglob("*") if p.suffix in (".py", ".json")
                       and not p.relative_to(root).as_posix().startswith(OTHER_FAMILIES))]
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.relative_to(HERE.parent.parent).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def staleness(release: str) -> str | None:
    """Why the committed list of ``release`` may be stale (measured with another fidelity script than this one), or
    None."""
    path = divergences_file(release)
    measured = json.loads(path.read_text()).get("script") if path.exists() else None
    if measured == script_digest():
        return None
    was = f"script {measured}" if measured else "a script of before the lists were stamped"
    return (f"{path.name} was measured with {was}, not this one ({script_digest()}: the script and the fake's "
            f"sources): its steps or the fake's answers may have changed since; re-measure with python -m "
            f"gpu.fidelity --release {release} --update")


def spec(model_dir: Path, fake: bool, release: str) -> EngineSpec:
    """One launch line for both engines; LoRA on where the release was measured serving it on CPU (real SGLang
    there with its torch-native LoRA backend)."""
    lora = release in SGLANG_FACTS.lora_cpu_releases
    flags = tuple(f for f in CPU_FLAGS if f != "--disable-cuda-graph") + (CPU_LORA_FLAGS if lora and not fake else ())
    fake_args = ("--fake-profile", release, "--fake-tokens-per-second", "1000") if fake else ()
    return EngineSpec(model_path=str(model_dir), extra_args=flags, fake_args=fake_args, enable_lora=lora)


def run_engine(model_dir: Path, work: Path, release: str, fake: bool, venv: Path | None,
               sent: list[Sent] | None = None) -> tuple[dict, dict]:
    """Run each of the script's lifetimes on a fresh engine (start, run, record whether the server exited, stop);
    the observations and what the starts and runs cost. Every request sent is appended to ``sent``."""
    python = None if fake else str(python_of(venv))
    kind = "fake" if fake else "real"
    seen: dict[str, Any] = {}
    cost: dict[str, Any] = {"starts": 0, "start_s": 0.0, "script_s": 0.0}
    for lifetime in LIFETIMES:
        engine = EngineProcess(spec(model_dir, fake, release), FAKE if fake else SGLANG, env=CPU_ENV,
                               name=f"fidelity-{kind}-{release}", python=python)
        started = time.monotonic()
        try:
            engine.start(START_TIMEOUT_S)
            cost["starts"] += 1
            cost["start_s"] = round(cost["start_s"] + time.monotonic() - started, 1)
            if lifetime == "main":
                cost["rss_gb"] = rss_gb(engine.process.pid)
            began = time.monotonic()
            out = asyncio.run(run_script(engine.url, model_dir, work / kind / lifetime.replace(" ", "-"), release,
                                         lora=engine.spec.enable_lora, lifetime=lifetime, sent=sent))
            cost["script_s"] = round(cost["script_s"] + time.monotonic() - began, 1)
            if lifetime != "main":
                out[f"{EXITED} ({lifetime})"] = {"exited": exited(engine, lost(lifetime) in out)}
            seen.update(out)
        finally:
            engine.stop()
    return seen, cost


def exited(engine: EngineProcess, lost_connection: bool) -> bool:
    """Whether the engine's server process exited at the end of a lifetime: waited for (at most
    :data:`EXIT_WAIT_S`) when the lifetime lost its connection, else whether it already had."""
    return engine.exits_within(EXIT_WAIT_S if lost_connection else 0.0)


def rss_gb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants, GB (Linux ``/proc``)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return round(total / 1e9, 2)


def coverage_main(releases: Sequence[str]) -> int:
    """The script on the fake alone, per release: what of the fake's surface it leaves uncompared, against the
    committed list (exit 1 on an unexplained or stale entry)."""
    from gpu.tiny_model import write_model

    from .coverage import listed, report, uncovered

    found, cut = {}, []
    with tempfile.TemporaryDirectory(prefix="weightsync-fidelity-") as tmp:
        work = Path(tmp)
        model_dir = write_model(work / "model")

        def sent_on(release: str) -> tuple[list[Sent], dict[str, Any]]:
            sent: list[Sent] = []
            seen, _ = run_engine(model_dir, work / release, release, True, None, sent)
            return sent, seen

        with concurrent.futures.ThreadPoolExecutor(len(releases)) as pool:  # fakes that mostly wait, side by side
            for release, (sent, seen) in zip(releases, pool.map(sent_on, releases)):
                found[release] = uncovered(release, sent)
                cut += [f"  CUT SHORT {release} {line}" for line in cut_short(seen)]
    text, holds = report(found, listed())
    print("\n".join([text, *cut]))
    return 0 if holds and not cut else 1


def cut_short(seen: dict[str, Any]) -> list[str]:
    """The lifetimes that lost their server though none of their calls ends one (the main sequence, the state matrix):
    where, and how; what they would have sent after it went unsent."""
    return [f"{lifetime}: the connection was lost at {cut['at']!r} ({cut['error']}); nothing after it was sent"
            for lifetime in ("main", MATRIX) if (cut := seen.get(lost(lifetime))) is not None]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--engine" in argv:  # another family's differential (its row's ``fidelity``: gpu.fidelity.vllm)
        from conformance.families import FAMILIES, load

        at = argv.index("--engine")
        engine = argv[at + 1] if at + 1 < len(argv) else ""
        rest = argv[:at] + argv[at + 2:]
        compared = {f.name: f.load_real().fidelity for f in FAMILIES.values() if f.real is not None}
        if engine not in compared:
            print(f"gpu.fidelity: --engine {engine!r}: choose {' or '.join(compared)}", file=sys.stderr)
            return 2
        if compared[engine] is not None:
            return load(compared[engine])(rest)
        argv = rest
    parser = argparse.ArgumentParser(prog="python -m gpu.fidelity", description=__doc__.split("\n\n")[0])
    parsed = command_line(parser, argv, RELEASES, "SGLang", coverage_main, status, UNCOVERED)
    if isinstance(parsed, int):
        return parsed
    args, env = parsed
    from gpu.tiny_model import write_model

    with tempfile.TemporaryDirectory(prefix="weightsync-fidelity-") as tmp:
        work = Path(tmp)
        model_dir = write_model(work / "model")
        try:  # the fake beside the real engine: it mostly waits (on its held requests, on calls it holds)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                faked = pool.submit(run_engine, model_dir, work, args.release, True, None)
                real, real_cost = run_engine(model_dir, work, args.release, False, env.venv)
                fake, fake_cost = faked.result()
        except EngineStartError as error:
            print(f"gpu.fidelity: an engine did not start: {str(error).splitlines()[0]}", file=sys.stderr)
            return 1
    found = diff(fake, real)
    print(f"sglang {args.release}: fake {fake_cost}, real {real_cost}; {len(found)} divergences")
    stale = staleness(args.release)
    if stale and not args.update:
        print(f"  STALE   {stale}")
    listed = {key(e): e for e in known(args.release)}
    new, gone = compare(found, list(listed.values()))
    for d in found:
        mark = "  NOT BUILT" if d.get("not_built") else "  NEW   " if d in new else "  race  " if is_race(
            listed[key(d)]) else "  listed"
        print(f"{mark} {d['step']} / {d['field']}: fake {json.dumps(d['fake'])} | real {json.dumps(d['real'])}")
    for e in gone:
        print(f"  GONE    {e['step']} / {e['field']}: listed, no longer diverges (remove it)")
    if args.json:
        args.json.write_text(json.dumps({"fake": fake, "real": real, "diff": found, "cost": {
            "fake": fake_cost, "real": real_cost}}, indent=1))
    if args.update:
        found_keys = {key(d) for d in found}
        races = [e for k, e in listed.items() if is_race(e) and k not in found_keys]
        entries = [{**d, "class": listed.get(key(d), {}).get("class", "TODO"),
                    "why": listed.get(key(d), {}).get("why", "TODO")} for d in found] + races
        divergences_file(args.release).write_text(json.dumps(
            {"release": args.release, "script": script_digest(), "divergences": entries}, indent=1) + "\n")
    return 1 if new or gone else 0


if __name__ == "__main__":
    from gpu.engine import exit_on_sigterm

    exit_on_sigterm()
    sys.exit(main())
