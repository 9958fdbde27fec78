"""How much a simulation's figures move with the order of jobs submitted in the
same second (README, "Results: Philly after 2017-10-15").

A trace lists jobs submitted in one second in some order, and every policy breaks
its ties by that order (the simulator's `seq`). This runs `simulate` over the same
jobs with that order as in the trace (`trace`) and permuted within each second by a
seeded generator (a seed), for each policy, and prints one JSON line per run.

    .venv/bin/python -m bench.tie_orders --seeds trace,1,2,3 --policies rl,drf \\
        [--trace ...] [--cluster clusters/philly-hetero.yaml] [--since 2017-10-15]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import cast

import numpy as np

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cli import simulate as cli
from shared.sim import simulate
from shared.traces import SkipStats, TraceJob

TRACE = "../shared/traces/philly/philly-sep-oct.csv"


def shuffled(jobs: list[TraceJob], seed: int) -> list[TraceJob]:
    """`jobs` by submit time, those of one second in a seeded random order (seed < 0:
    the trace's order)."""
    ordered = sorted(jobs, key=lambda j: j.submit_s)  # stable: the trace's order
    if seed < 0:
        return ordered
    rng = np.random.default_rng(seed)
    out: list[TraceJob] = []
    for _, same in itertools.groupby(ordered, key=lambda j: j.submit_s):
        group = list(same)
        out += [group[i] for i in rng.permutation(len(group))]
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tie_orders", description=__doc__)
    p.add_argument("--seeds", default="trace,1,2,3", help="`trace`: the trace's order")
    p.add_argument("--policies", default="rl,drf")
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--cluster", default="clusters/philly-hetero.yaml")
    p.add_argument("--since", default="2017-10-15")
    a = p.parse_args(argv)
    sub = argparse.ArgumentParser().add_subparsers()
    cli.register(sub)
    parser = sub.choices["simulate"]
    args = parser.parse_args(["--trace", a.trace, "--format", "philly", "--cluster", a.cluster,
                              "--since", a.since, "--policy", "fifo"])  # fmt: skip
    cluster = cli.load_run_cluster(args)
    jobs = cli.load_run_jobs(args, cluster, SkipStats())
    for seed in (-1 if s == "trace" else int(s) for s in a.seeds.split(",")):
        order = shuffled(jobs, seed)
        for name in a.policies.split(","):
            policy = make_policy(name)
            with cli._LazyProgress(f"{name} seed {seed}") as bar:
                res = simulate(order, cluster, policy, make_placer(args.placer, reproducible=True),
                               cli.sim_config(args), bar.tick)  # fmt: skip
            s = res.summary()
            row = {"seed": seed, "policy": name, "avg_bsld": s["avg_bsld"],
                   "avg_jct_h": cast(float, s["avg_jct_s"]) / 3600, "gpu_util": s["gpu_util"],
                   "sim_s": res.wall_s}  # fmt: skip
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
