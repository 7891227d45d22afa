"""How fast the production-scale replay runs, and how its cost grows with engines and with requests in flight.

Every size runs in a fresh child process, one after the other (one core each; peak memory is the child's own;
``--quick``: every size shrunk, in this process):
the default full size (16 engines, 1,024 episodes in flight, 20 updates) for the reference and for the seed-000
bug, then engines 4 / 64 at the same load, then 256 / 4,096 episodes in flight on 16 engines (batch and buffer
scaled with them). Ratios are against the reference at the default size, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from _bench import REPO, emit, machine, parser, table

REFERENCE, BUG = "conformance.reference:integration", "conformance.mutants:version_bump_aborts"


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def one(spec: str, overrides: dict) -> dict:
    """Run one size in this process; the figures as a dict."""
    from conformance.cases import load_integration
    from conformance.replay import ReplayConfig, replay

    integration = load_integration(spec)
    config = ReplayConfig(**overrides)
    before = _rss_kib()
    run = replay(integration, config)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    generates = sum(1 for c in run.history.wire if c.path == "/generate")
    return {"wall_s": run.wall_s, "cpu_s": run.cpu_s, "sim_s": run.sim_s, "generates": generates,
            "updates": len(run.history.cycles), "rss_mib": peak / 1024, "grew_mib": max(0, peak - before) / 1024,
            "broke": [b.message for b in run.history.breaks]}


def sizes(quick: bool) -> list[tuple[str, str, dict]]:
    """(row name, integration, ReplayConfig overrides); ``quick`` shrinks every size by 4 (engines) and 16 (load)."""
    from conformance.replay import ReplayConfig

    default = ReplayConfig()
    shrink_e, shrink_g = (4, 16) if quick else (1, 1)
    base = dict(updates=2) if quick else {}

    def size(engines: int, groups: int) -> dict:
        engines, groups = max(1, engines // shrink_e), max(2, groups // shrink_g)
        return {**base, "engines": engines, "groups_in_flight": groups, "batch_groups": max(1, 12 * groups // 128),
                "buffer_groups": max(2, 16 * groups // 128)}

    def name(who: str, o: dict) -> str:
        return f"{who}, {o['engines']} engines, {o['groups_in_flight'] * default.group_size:,} in flight"

    e, g = default.engines, default.groups_in_flight
    rows = [(name("reference", size(e, g)) + " (baseline)", REFERENCE, size(e, g)),
            (name("seed-000 bug", size(e, g)), BUG, size(e, g))]
    rows += [(name("reference", size(n, g)), REFERENCE, size(n, g)) for n in (e // 4, e * 4)]
    rows += [(name("reference", size(e, n)), REFERENCE, size(e, n)) for n in (g // 4, g * 4)]
    return rows


def measure(spec: str, overrides: dict, in_process: bool) -> dict:
    """One size's figures: in a child process (its own peak memory), or here (``--quick``)."""
    if in_process:
        return one(spec, overrides)
    proc = subprocess.run([sys.executable, __file__, "--one", spec, json.dumps(overrides)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{spec} {overrides}: the child exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--one", nargs=2, metavar=("SPEC", "JSON"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], json.loads(args.one[1]))))
        return
    t0 = time.perf_counter()
    emit(f"# replay_scale ({'quick' if args.quick else 'full'}; {machine()})")
    results = []
    for name, spec, overrides in sizes(args.quick):
        r = measure(spec, overrides, in_process=args.quick)
        if r["broke"]:
            raise SystemExit(f"{name}: the replay broke: {r['broke']}")
        results.append((name, r))
    base = results[0][1]
    rows = [(name, r["sim_s"] / 3600, r["updates"], r["generates"], r["wall_s"], r["cpu_s"], r["sim_s"] / r["wall_s"],
             r["sim_s"] / r["cpu_s"], r["rss_mib"], r["grew_mib"], r["cpu_s"] / base["cpu_s"],
             (r["cpu_s"] / r["generates"]) / (base["cpu_s"] / base["generates"])) for name, r in results]
    emit(table("replay cost by size", ["run", "sim h", "updates", "/generate", "wall s", "CPU s", "sim s/wall s",
                                      "sim s/CPU s", "peak RSS MiB", "grew MiB", "CPU vs baseline",
                                      "CPU/request vs baseline"], rows))
    emit(f"baseline: {base['sim_s'] / 3600:.2f} simulated h in {base['wall_s']:.1f} s wall ({base['cpu_s']:.1f} s "
         f"CPU): {base['sim_s'] / base['wall_s']:,.0f} simulated s per wall s; peak RSS {base['rss_mib']:.0f} MiB "
         f"(grew {base['grew_mib']:.0f} MiB)")
    emit(f"total time: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
