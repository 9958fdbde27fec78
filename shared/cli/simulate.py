"""`rltune simulate`: one policy on one trace and cluster, in process."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import Any

from shared.cli import common
from shared.cluster import ClusterSpec, load_cluster
from shared.errors import UserError
from shared.speeds import DEFAULT_SPEEDS
from shared.traces import SkipStats, TraceJob

__all__ = ["add_run_args", "load_run_cluster", "load_run_jobs", "register", "run", "write_json"]


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The flags `simulate` and `eval` share (trace, cluster, placement, seed)."""
    p.add_argument("--trace", required=True, help="trace file")
    p.add_argument(
        "--format", required=True, help="philly, helios, alibaba2020, alibaba2023, rltune, jsonl"
    )
    p.add_argument("--cluster", required=True, help="cluster YAML or openb node list CSV")
    p.add_argument(
        "--reference",
        default=None,
        metavar="TYPE",
        help="GPU type the trace's durations were measured on (default: the cluster's `reference`)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    p.add_argument("--limit", type=int, default=None, help="only the first N jobs by submit time")
    p.add_argument(
        "--since",
        default="",
        metavar="TIME",
        help="only jobs submitted at or after TIME (UTC YYYY-MM-DD[ HH:MM:SS] or trace seconds)",
    )
    p.add_argument(
        "--until", default="", metavar="TIME", help="only jobs submitted before TIME (as --since)"
    )
    p.add_argument(
        "--placer",
        default="milp",
        help="placement: milp (default, OR-Tools CP-SAT), greedy, first-fit, best-fit, fgd",
    )
    p.add_argument(
        "--window", type=int, default=128, help="jobs the policy hands placement per round"
    )
    p.add_argument("--preempt", action="store_true", help="let a preemptive policy (las) preempt")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a trace on a cluster under one policy")
    add_run_args(p)
    p.add_argument("--policy", required=True, help="fifo, sjf-oracle, sjf-est, smallest, f1, ...")
    p.add_argument(
        "--json", default=None, metavar="OUT", help="write the summary JSON ('-': stdout)"
    )
    p.add_argument(
        "--jobs-out", default=None, metavar="F", help="write one CSV row per run segment"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy
    from shared.sim import SimConfig, simulate, write_jobs_csv

    if args.window <= 0:
        raise UserError(f"--window must be positive, got {args.window}")
    cluster = load_run_cluster(args)
    policy = make_policy(args.policy)
    placer = make_placer(args.placer, reproducible=True)
    stats = SkipStats()
    jobs = load_run_jobs(args, cluster, stats)
    config = SimConfig(window=args.window, seed=args.seed, preempt=args.preempt)
    result = simulate(jobs, cluster, policy, placer, config)
    summary = result.summary()
    if args.jobs_out:
        write_jobs_csv(result.records, args.jobs_out)
    if args.json:
        write_json(summary, args.json)
    rate = len(jobs) / result.wall_s if result.wall_s > 0 else math.inf
    skipped = ", ".join(f"{n} {r}" for r, n in sorted(stats.counts.items())) or "none"
    rejected = sum(result.rejected.values())
    print(
        f"{policy.label}: {summary['jobs']} jobs finished, {rejected} rejected, "
        f"avg JCT {summary['avg_jct_s']:.0f} s, avg queue {summary['avg_queue_s']:.0f} s, "
        f"GPU util {summary['gpu_util']:.3f}; {len(jobs)} jobs in {result.wall_s:.2f} s "
        f"({rate:.0f} jobs/s); trace rows skipped: {skipped}",
        file=sys.stderr,
    )
    return 0


def load_run_cluster(args: argparse.Namespace) -> ClusterSpec:
    """The `--cluster`, with `--reference` applied if given."""
    cluster = load_cluster(args.cluster)
    if args.reference is None:
        return cluster
    if args.reference not in cluster.speed and args.reference not in DEFAULT_SPEEDS:
        raise UserError(f"--reference {args.reference!r}: no speed known for that GPU type")
    return dataclasses.replace(cluster, reference=args.reference)


def load_run_jobs(
    args: argparse.Namespace, cluster: ClusterSpec, stats: SkipStats
) -> list[TraceJob]:
    """The trace's jobs submitted in [--since, --until), the first --limit of them."""
    from shared.sim import load_jobs
    from shared.traces._io import parse_time

    bounds = []
    for flag, text in (("--since", args.since), ("--until", args.until)):
        try:
            bounds.append(parse_time(text) if text else None)
        except ValueError:
            raise UserError(
                f"{flag} {text!r}: give YYYY-MM-DD[ HH:MM:SS] (UTC) or seconds"
            ) from None
    since, until = bounds
    if since is None and until is None:
        return load_jobs(args.trace, args.format, cluster, stats, args.limit)
    jobs = [
        j
        for j in load_jobs(args.trace, args.format, cluster, stats)
        if (since is None or j.submit_s >= since) and (until is None or j.submit_s < until)
    ]
    if not jobs:
        raise UserError(f"{args.trace}: no job submitted in [--since, --until)")
    return jobs[: args.limit] if args.limit is not None else jobs


def write_json(summary: dict[str, Any], out: str) -> None:
    """The summary as one JSON object (NaN, e.g. no job finished, written as null)."""
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in summary.items()
    }
    common.write_json(clean, out)
