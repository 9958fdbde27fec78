"""`rltune bench sim`: simulated jobs per second on the whole Philly trace, for
each policy with greedy and with MILP placement side by side in one run, and the
MILP / greedy ratio.

    rltune bench sim [--trace F] [--cluster C] [--policies fifo,sjf-est]
                     [--placers greedy,milp] [--discipline D] [--repeat N] [--profile]

Each (policy, placer) runs `--repeat` times in this one process (the best time
counts, the median is shown too); the trace is read once, outside the timing. The
MILP runs as in `rltune simulate` (reproducible: CP-SAT stops on deterministic time).
With `--profile`, one more run per pair under cProfile prints where time goes.
Target (issue 8): the MILP at least 3,000 jobs/s on the whole trace.
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
from shared.placement_api import DISCIPLINES
from shared.sim import SimConfig, load_jobs, simulate
from shared.traces import SkipStats

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "philly" / "philly-sep-oct.csv"
TARGETS = {"milp": 3_000.0}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rltune bench sim", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--format", default="philly")
    p.add_argument("--cluster", default=str(ROOT / "clusters" / "philly.yaml"))
    p.add_argument("--policies", default="fifo,sjf-est")
    p.add_argument("--placers", default="greedy,milp")
    p.add_argument("--discipline", default="easy", choices=DISCIPLINES)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--limit", type=int, default=None, help="only the first N jobs")
    args = p.parse_args(argv)
    cluster = load_cluster(args.cluster)
    t0 = time.perf_counter()
    jobs = load_jobs(args.trace, args.format, cluster, SkipStats(), args.limit)
    read_s = time.perf_counter() - t0
    placers = [n.strip() for n in args.placers.split(",") if n.strip()]
    print(f"trace {Path(args.trace).name}: {len(jobs)} jobs read in {read_s:.2f} s (not timed)")
    print(
        f"cluster {cluster.name}: {cluster.total_gpus} GPUs; discipline {args.discipline}, "
        f"window {SimConfig().window}"
    )
    config = SimConfig(discipline=args.discipline)
    for name in args.policies.split(","):
        rates: dict[str, int] = {}
        for placer_name in placers:
            times = []
            for _ in range(max(1, args.repeat)):
                policy, placer = make_policy(name), make_placer(placer_name, reproducible=True)
                t = time.perf_counter()
                result = simulate(jobs, cluster, policy, placer, config)
                times.append(time.perf_counter() - t)
            rates[placer_name] = round(len(jobs) / min(times))
            median = len(jobs) / statistics.median(times)
            target = TARGETS.get(placer_name)
            verdict = ""
            if target:
                met = "met" if rates[placer_name] >= target else "MISSED"
                verdict = f" (target {target:,.0f}: {met})"
            solves = getattr(placer, "cycles", 0)
            print(
                f"{name:>10} {placer_name:>7}: {rates[placer_name]:>9,} jobs/s best, "
                f"{median:>9,.0f} median of {len(times)}; {result.rounds} placer calls, "
                f"{solves} solver models, {result.priority_inversions} inversions{verdict}"
            )
        for other in placers[1:]:
            ratio = rates[other] / rates[placers[0]]
            print(f"ratio {other} / {placers[0]} ({name}): {ratio:.2f}")
    if args.profile:
        for name in args.policies.split(","):
            for placer_name in placers:
                _profile(jobs, cluster, name, placer_name, config)
    return 0


def _profile(jobs: list, cluster: object, name: str, placer: str, config: SimConfig) -> None:
    prof = cProfile.Profile()
    prof.enable()
    simulate(jobs, cluster, make_policy(name), make_placer(placer, reproducible=True), config)  # type: ignore[arg-type]
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(8)
    print(f"--- profile of {name} with {placer} (cProfile, by own time) ---")
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    print("\n".join(lines[-9:]))
