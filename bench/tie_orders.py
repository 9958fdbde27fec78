"""How much a simulation's figures move with the order of jobs submitted in the
same second (docs/results/rl.md, "Held-out").

A trace lists jobs submitted in one second in some order, and every policy breaks
its ties by that order (the simulator's `seq`). This runs `simulate` over the same
jobs with that order as in the trace (`trace`) and permuted within each second by a
seeded generator (a seed), for each policy, and prints one JSON line per run.

    .venv/bin/python -m bench.tie_orders --seeds trace,1,2,3 --policies rl,drf \\
        [--trace ...] [--cluster clusters/philly-hetero.yaml] [--since 2017-10-15] \\
        [--until TIME] [--load L] [--placer milp]

Last, on stderr, each policy's figures over the orders: mean avg bounded slowdown,
its range, and the mean of its per-order ratios to the `--against` policy's
(default: the last one named), side by side from the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import cast

import numpy as np

from rltune import simulate as cli
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.scoring.rl.env import shuffle_ties
from shared.sim import simulate
from shared.traces import SkipStats, TraceJob

TRACE = "../shared/traces/philly/philly-sep-oct.csv"


def shuffled(jobs: list[TraceJob], seed: int) -> list[TraceJob]:
    """`jobs` by submit time, those of one second in a seeded random order (seed < 0:
    the trace's order); the same shuffle as training episodes' `--shuffle-ties`."""
    if seed < 0:
        return sorted(jobs, key=lambda j: j.submit_s)  # stable: the trace's order
    return shuffle_ties(jobs, np.random.default_rng(seed))


def add_slice_args(p: argparse.ArgumentParser, policies: str) -> None:
    """The flags of a Philly slice run over several orders (also bench.rank_ceiling's)."""
    p.add_argument("--seeds", default="trace,1,2,3", help="`trace`: the trace's order")
    p.add_argument("--policies", default=policies)
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--cluster", default="clusters/philly-hetero.yaml")
    p.add_argument("--since", default="2017-10-15")
    p.add_argument("--until", default="")
    p.add_argument("--load", default="", help="compress arrivals to this load (as simulate)")
    p.add_argument("--placer", default="milp")
    p.add_argument("--share-fraction", default="", help="GPU shares (as simulate)")


def simulate_args(a: argparse.Namespace) -> argparse.Namespace:
    """`rltune simulate`'s arguments for the slice `a` names (its checks included)."""
    sub = argparse.ArgumentParser().add_subparsers()
    cli.register(sub)
    extra = ["--until", a.until] if a.until else []
    extra += ["--load", a.load] if a.load else []
    extra += ["--share-fraction", a.share_fraction] if a.share_fraction else []
    return sub.choices["simulate"].parse_args(
        ["--trace", a.trace, "--format", "philly", "--cluster", a.cluster, "--since", a.since,
         "--policy", "fifo", "--placer", a.placer, *extra]
    )  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tie_orders", description=__doc__)
    add_slice_args(p, "rl,drf")
    p.add_argument("--against", default="", help="ratios to this policy (default: the last)")
    a = p.parse_args(argv)
    args = simulate_args(a)
    names = a.policies.split(",")
    against = a.against or names[-1]
    if against not in names:
        raise SystemExit(f"--against {against!r} is not one of --policies")
    bsld: dict[str, list[float]] = {n: [] for n in names}
    cluster = cli.load_run_cluster(args)
    jobs = cli.load_run_jobs(args, cluster, SkipStats())
    for seed in (-1 if s == "trace" else int(s) for s in a.seeds.split(",")):
        order = shuffled(jobs, seed)
        for name in names:
            policy = make_policy(name)
            with cli._LazyProgress(f"{name} seed {seed}") as bar:
                res = simulate(order, cluster, policy, make_placer(args.placer, reproducible=True),
                               cli.sim_config(args), bar.tick)  # fmt: skip
            s = res.summary()
            row = {"seed": seed, "policy": name, "avg_bsld": s["avg_bsld"],
                   "avg_jct_h": cast(float, s["avg_jct_s"]) / 3600, "gpu_util": s["gpu_util"],
                   "sim_s": res.wall_s}  # fmt: skip
            print(json.dumps(row), flush=True)
            bsld[name].append(cast(float, s["avg_bsld"]))
    ref = np.asarray(bsld[against])
    print(
        f"avg bsld over {len(ref)} orders ({a.seeds}), {a.cluster} {a.placer}, "
        f"{a.since}..{a.until or 'end'}, load {a.load or 'as traced'}"
        f"{f', shares {a.share_fraction}' if a.share_fraction else ''}:",
        file=sys.stderr,
    )
    for name in names:
        v = np.asarray(bsld[name])
        print(f"  {name:24s} mean {v.mean():.3f}  range {v.min():.3f}-{v.max():.3f}  "
              f"vs {against} (mean of ratios) {np.mean(v / ref) - 1:+.1%}",
              file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
