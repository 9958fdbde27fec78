"""`rltune bench sim`: simulated jobs per second on the whole Philly trace with
greedy placement, fifo and sjf-est side by side, and their ratio.

    rltune bench sim [--trace F] [--cluster C] [--policies fifo,sjf-est] [--repeat N] [--profile]

Each policy runs `--repeat` times in this one process (the best time counts,
the median is shown too); the trace is read once, outside the timing. With
`--profile`, one more run per policy under cProfile prints where time goes.
Targets (issue 3): fifo >= 10,000 jobs/s, sjf-est >= 5,000 jobs/s.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cluster import load_cluster
from shared.sim import SimConfig, load_jobs, simulate
from shared.traces import SkipStats

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "philly" / "philly-sep-oct.csv"
TARGETS = {"fifo": 10_000.0, "sjf-est": 5_000.0}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rltune bench sim", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--format", default="philly")
    p.add_argument("--cluster", default=str(ROOT / "clusters" / "philly.yaml"))
    p.add_argument("--policies", default="fifo,sjf-est")
    p.add_argument("--placer", default="greedy")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--limit", type=int, default=None, help="only the first N jobs")
    args = p.parse_args(argv)
    cluster = load_cluster(args.cluster)
    t0 = time.perf_counter()
    jobs = load_jobs(args.trace, args.format, cluster, SkipStats(), args.limit)
    read_s = time.perf_counter() - t0
    name = Path(args.trace).name
    print(f"trace {name}: {len(jobs)} jobs read in {read_s:.2f} s (not timed below)")
    print(f"cluster {cluster.name}: {cluster.total_gpus} GPUs; placer {args.placer}")
    rates: dict[str, float] = {}
    for name in args.policies.split(","):
        times = []
        for _ in range(max(1, args.repeat)):
            policy, placer = make_policy(name), make_placer(args.placer)
            t = time.perf_counter()
            result = simulate(jobs, cluster, policy, placer, SimConfig())
            times.append(time.perf_counter() - t)
        rates[name] = len(jobs) / min(times)
        median = len(jobs) / statistics.median(times)
        target = TARGETS.get(name)
        verdict = ""
        if target:
            verdict = f" (target {target:,.0f}: {'met' if rates[name] >= target else 'MISSED'})"
        print(
            f"{name:>12}: {rates[name]:>9,.0f} jobs/s best, {median:>9,.0f} median of {len(times)};"
            f" queue up to {result.max_waiting}, {result.rounds} placer calls{verdict}"
        )
    names = list(rates)
    for other in names[1:]:
        print(f"ratio {other} / {names[0]}: {rates[other] / rates[names[0]]:.2f}")
    if args.profile:
        for name in names:
            _profile(jobs, cluster, name, args.placer)
    return 0


def _profile(jobs: list, cluster: object, name: str, placer: str) -> None:
    prof = cProfile.Profile()
    prof.enable()
    simulate(jobs, cluster, make_policy(name), make_placer(placer), SimConfig())  # type: ignore[arg-type]
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(8)
    print(f"--- profile of {name} (cProfile, by own time) ---")
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    print("\n".join(lines[-9:]))
