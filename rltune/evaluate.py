"""`rltune eval`: several policies on the same trace and cluster, compared in one
table (markdown + CSV) and PNG plots, written to `--out DIR`."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from rltune.common import out_dir
from rltune.simulate import (
    add_run_args,
    check_outcome,
    interval_text,
    load_run_cluster,
    load_run_jobs,
    mark_offload,
    sim_config,
)
from shared.errors import UserError
from shared.traces import SkipStats, require_fields

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="compare policies on one trace: table and plots")
    add_run_args(p)
    p.add_argument(
        "--policies",
        required=True,
        help="comma-separated policy names, e.g. fifo,sjf-est,sjf-oracle,rl:MODEL",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory for table and plots")
    p.add_argument("--no-jobs", action="store_true", help="do not write jobs-<policy>.csv files")
    p.add_argument(
        "--matrix",
        default=None,
        metavar="FILE",
        help="instead of one trace: every cell (trace, format, cluster, load, slice) of a "
        "YAML/JSON list, for rl and every heuristic (or --policies); per cell each "
        "policy's ratio to the best heuristic, geometric means, a heat map "
        "(rltune/matrix.py)",
    )
    # with --matrix the cells name the traces: these are checked in `run` instead
    for action in p._actions:
        if action.dest in ("trace", "format", "policies"):
            action.required = False
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy
    from shared.report import PolicyRun, markdown_table, write_csv, write_plots
    from shared.sim import simulate, write_jobs_csv

    if args.matrix is not None:
        from rltune.matrix import matrix_command

        return matrix_command(args.matrix, args.out, args.policies or "", args.placer, args.seed)
    for flag in ("trace", "format", "policies"):
        if not getattr(args, flag):
            raise UserError(f"--{flag} is required (or --matrix FILE)")
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if not names:
        raise UserError("--policies names no policy")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"--policies names {', '.join(twice)} twice: each runs once")
    policies = [make_policy(n) for n in names]  # every name checked before any long run
    make_placer(args.placer, reproducible=True)
    out = out_dir(args.out)
    cluster = load_run_cluster(args)
    stats = SkipStats()
    jobs = mark_offload(args, load_run_jobs(args, cluster, stats))
    for policy in policies:
        require_fields(policy.label, getattr(policy, "needs", ()), jobs, args.trace)
    config = sim_config(args)
    console = Console(stderr=True)
    runs: list[PolicyRun] = []
    columns = (
        TextColumn("{task.description:<22}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} jobs"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        for name, policy in zip(names, policies, strict=True):
            task = bar.add_task(policy.label, total=len(jobs))

            def tick(done: int, total: int, task: TaskID = task) -> None:
                bar.update(task, completed=done)

            result = simulate(
                jobs, cluster, policy, make_placer(args.placer, reproducible=True), config, tick
            )
            label = policy.label
            if args.preempt and getattr(policy, "preemptive", False):
                label += " +preempt"
            runs.append(PolicyRun(label, result.summary(), result.records, result.wall_s))
            if not args.no_jobs:
                write_jobs_csv(result.records, out / jobs_file(name))
    written = set() if args.no_jobs else {jobs_file(n) for n in names}
    stale = _remove_stale(out, written)
    if stale:
        console.print(f"removed {', '.join(stale)} from {out}: a previous run's, not this one's")
    table = markdown_table(runs)
    (out / "summary.md").write_text(_preamble(args, len(jobs), stats, cluster.total_gpus) + table)
    write_csv(runs, out / "summary.csv")
    plots = write_plots(runs, cluster.total_gpus, out)
    sys.stdout.write(table)
    console.print(f"wrote {out / 'summary.md'}, summary.csv, " + ", ".join(p.name for p in plots))
    codes = [
        check_outcome(run.label, len(jobs), run.summary, jobs, cluster.gpu_types) for run in runs
    ]
    return max(codes, default=0)


def jobs_file(name: str) -> str:
    """The per-job CSV of policy `name`: `jobs-fifo.csv`; `rl:PATH` by the checkpoint's
    file stem (`rl:models/x.pt` -> `jobs-rl_x.csv`), never a path into other folders."""
    if name.startswith("rl:"):
        name = "rl:" + Path(name[3:]).stem
    return "jobs-" + re.sub(r"[^A-Za-z0-9._-]+", "_", name) + ".csv"


def _preamble(args: argparse.Namespace, n: int, stats: SkipStats, gpus: int) -> str:
    skipped = ", ".join(f"{k} {r}" for r, k in sorted(stats.counts.items())) or "none"
    cmd = " ".join(["rltune", *sys.argv[1:]]) if sys.argv[1:2] == ["eval"] else "rltune eval ..."
    return (
        f"Trace `{args.trace}` ({args.format}, {n} jobs; rows skipped: {skipped}) on cluster "
        f"`{args.cluster}` ({gpus} GPUs), placer `{args.placer}`, discipline "
        f"`{args.discipline}`, window {args.window}{interval_text(args.round_interval)}, "
        f"seed {args.seed}{', preemption on' if args.preempt else ''}{_arrivals(args)}."
        f"\n\n`{cmd}`\n\n"
    )


def _arrivals(args: argparse.Namespace) -> str:
    """How the arrivals were replayed and compressed, for the preamble ("" if not)."""
    text = f", the jobs replayed {args.repeat} times back to back" if args.repeat != 1 else ""
    if args.share_fraction:
        text += f", {args.share_fraction:.0%} of whole one-GPU jobs made GPU shares (seeded)"
    factor = getattr(args, "load_factor", None)
    if args.load is not None and factor is not None:
        text += (
            f", arrivals compressed to load {args.load:g} ({args.load_basis}; submission gaps "
            f"divided by {factor:.4g})"
        )
    return text


def _remove_stale(out: Path, written: set[str]) -> list[str]:
    """Remove the `jobs-*.csv` in `out` that this run did not write (a previous run's, of
    policies not run now, which its summary would otherwise sit beside); their names."""
    stale = sorted(p.name for p in out.glob("jobs-*.csv") if p.name not in written)
    for name in stale:
        (out / name).unlink()
    return stale
