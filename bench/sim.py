"""`rltune bench sim`: simulated jobs per second on the whole Philly trace, for
each policy with greedy and with MILP placement side by side in one run, and the
MILP / greedy ratio.

    rltune bench sim [--trace F] [--cluster C] [--policies fifo,sjf-est]
                     [--placers greedy,milp] [--disciplines strict,best-effort,easy]
                     [--repeat N] [--profile]

For each discipline and policy, every placer runs `--repeat` times in this one
process, one after the other; the trace is read once, outside the timing. Rates are
jobs per CPU second of this process (the best run; the simulator is one thread, so
on an idle machine that is the wall-clock rate, and on a shared one it is the figure
other work does not move), with the wall-clock rate beside it. The MILP runs as in
`rltune simulate` (reproducible: CP-SAT stops on deterministic time).
With `--profile`, one more run per triple under cProfile prints where time goes.
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
from shared.cluster import ClusterSpec, load_cluster
from shared.errors import UserError
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
    p.add_argument(
        "--disciplines",
        default=",".join(DISCIPLINES),
        help=f"comma-separated, from {', '.join(DISCIPLINES)} (default: all)",
    )
    p.add_argument("--discipline", choices=DISCIPLINES, help="only this one (= --disciplines D)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--limit", type=int, default=None, help="only the first N jobs")
    args = p.parse_args(argv)
    disciplines = [args.discipline] if args.discipline else _names(args.disciplines)
    bad = [d for d in disciplines if d not in DISCIPLINES]
    if bad:
        raise UserError(f"unknown discipline {bad[0]!r}; choose from {', '.join(DISCIPLINES)}")
    cluster = load_cluster(args.cluster)
    t0 = time.perf_counter()
    jobs = load_jobs(args.trace, args.format, cluster, SkipStats(), args.limit)
    read_s = time.perf_counter() - t0
    placers = _names(args.placers)
    policies = _names(args.policies)
    print(f"trace {Path(args.trace).name}: {len(jobs)} jobs read in {read_s:.2f} s (not timed)")
    print(f"cluster {cluster.name}: {cluster.total_gpus} GPUs; window {SimConfig().window}")
    print(
        "jobs/s per CPU second of this process (the best of --repeat; wall-clock in "
        "brackets, which other work on the machine slows)"
    )
    for discipline in disciplines:
        config = SimConfig(discipline=discipline)
        for name in policies:
            rates = {pl: _run(jobs, cluster, name, pl, config, args.repeat) for pl in placers}
            for pl, line in rates.items():
                print(f"{discipline:>11} {name:>10} {pl:>7}: {line[1]}")
            for other in placers[1:]:
                ratio = rates[other][0] / rates[placers[0]][0]
                print(f"ratio {other} / {placers[0]} ({name}, {discipline}): {ratio:.2f}")
    if args.profile:
        for discipline in disciplines:
            for name in policies:
                for placer_name in placers:
                    _profile(jobs, cluster, name, placer_name, SimConfig(discipline=discipline))
    return 0


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _run(
    jobs: list, cluster: ClusterSpec, name: str, placer_name: str, config: SimConfig, repeat: int
) -> tuple[float, str]:
    """(jobs per CPU second, the line to print) of one policy with one placer."""
    cpu, wall = [], []
    for _ in range(max(1, repeat)):
        policy, placer = make_policy(name), make_placer(placer_name, reproducible=True)
        w, c = time.perf_counter(), time.process_time()
        result = simulate(jobs, cluster, policy, placer, config)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    rate = len(jobs) / max(min(cpu), 1e-9)
    target = TARGETS.get(placer_name)
    verdict = ""
    if target:
        verdict = f" (target {target:,.0f}: {'met' if rate >= target else 'MISSED'})"
    solves = getattr(placer, "cycles", 0)
    recalled = getattr(getattr(placer, "inner", placer), "memo_hits", 0)
    line = (
        f"{rate:>9,.0f} jobs/s [{len(jobs) / statistics.median(wall):>7,.0f} wall]; "
        f"{result.rounds} placer calls, {solves} solver models, {recalled} remembered, "
        f"{result.priority_inversions} inversions{verdict}"
    )
    return rate, line


def _profile(jobs: list, cluster: object, name: str, placer: str, config: SimConfig) -> None:
    prof = cProfile.Profile()
    prof.enable()
    simulate(jobs, cluster, make_policy(name), make_placer(placer, reproducible=True), config)  # type: ignore[arg-type]
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(8)
    print(f"--- profile of {name} with {placer}, {config.discipline} (cProfile, own time) ---")
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    print("\n".join(lines[-9:]))
