"""`rltune simulate`: one policy on one trace and cluster, in process."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections import Counter
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from shared import recipe as run_recipe
from shared.cluster import ClusterSpec
from shared.errors import UserError
from shared.jsonfile import finite_or_null
from shared.jsonfile import write_json as write_json_file
from shared.placement_api import DISCIPLINES
from shared.recipe import RunRecipe
from shared.reclaim_flags import add_reclaim_args, check_reclaim_args
from shared.sched.replacement import Replacing
from shared.traces import SkipStats, TraceJob, require_fields

if TYPE_CHECKING:
    from shared.sim import SimConfig

__all__ = [
    "add_run_args",
    "check_outcome",
    "load_run_cluster",
    "load_run_jobs",
    "mark_offload",
    "recipe_of",
    "register",
    "run",
    "run_settings",
    "sim_config",
    "write_json",
]

# a run longer than this shows a progress bar on stderr
_PROGRESS_AFTER_S = 2.0


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The flags `simulate` and `eval` share (trace, cluster, placement, seed)."""
    p.add_argument("--trace", required=True, help="trace file")
    p.add_argument(
        "--format",
        required=True,
        help="philly, helios, alibaba2020, alibaba2023, rltune, jsonl, swf, alcf, itp",
    )
    p.add_argument(
        "--cluster",
        default=None,
        help="cluster YAML or openb node list CSV (required, but for --format swf: "
        "default the SWF header's MaxNodes x MaxProcs / MaxNodes slots)",
    )
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
        "--load",
        type=float,
        default=None,
        metavar="L",
        help="compress the submission times (every gap divided by one factor, printed) so "
        "that sum(GPUs x duration) / (submission span x capacity) = L (--load-basis offered) "
        "or the GPU-time inside the span over span x capacity = L (--load-basis span)",
    )
    p.add_argument(
        "--load-basis",
        default="offered",
        choices=("offered", "span"),
        help="what --load is a value of: offered (every job's whole run; the default) or "
        "span (only what falls inside the submission span: a utilisation the cluster would "
        "have if no job waited; use it for traces whose longest jobs outlast the span)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="K",
        help="replay the selected jobs K times back to back (copy k's ids end in #k), "
        "before --load: for a trace too small to load the cluster (default 1)",
    )
    p.add_argument(
        "--placer",
        default="milp",
        help="placement: milp (default, OR-Tools CP-SAT), greedy, first-fit, best-fit, fgd; "
        "milp+offload, greedy+offload: charged with offloading jobs' migration slowdown; "
        "milp+offload+replace, greedy+offload+replace: and running offloading jobs that have "
        "run long are moved where they stream less (settings printed)",
    )
    p.add_argument(
        "--window", type=int, default=128, help="jobs the policy hands placement per round"
    )
    p.add_argument("--preempt", action="store_true", help="let a preemptive policy (las) preempt")
    p.add_argument(
        "--discipline",
        default="easy",
        choices=DISCIPLINES,
        help="what a job that cannot start does to the jobs behind it: strict (nothing passes "
        "it), best-effort (later jobs that fit start, no reservation), easy (EASY backfill "
        "with a reservation from history estimates; the default)",
    )
    p.add_argument(
        "--round-interval",
        type=float,
        default=0.0,
        metavar="S",
        help="a periodic scheduler: rounds at most every S seconds of trace time (events "
        "between ticks wait for the next one, as under Slurm's sched_interval); default 0: "
        "a round at every arrival and finish",
    )
    add_reclaim_args(p, "sim")
    p.add_argument(
        "--offload-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="mark a seeded fraction F of the jobs without a model size as training with "
        "10Cache offload, sizes drawn from well-known models by GPU count (default 0: off; "
        "the distribution is printed when used)",
    )
    p.add_argument(
        "--share-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="make a seeded fraction F of the whole one-GPU jobs GPU shares of 1/4, 1/2 or "
        "3/4 of a GPU, run times as recorded, before --load compresses (default 0: off)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a trace on a cluster under one policy")
    add_run_args(p)
    p.add_argument("--policy", required=True, help="fifo, sjf-oracle, sjf-est, smallest, f1, ...")
    p.add_argument(
        "--json", default=None, metavar="OUT", help="write the summary JSON ('-': stdout)"
    )
    p.add_argument(
        "--jobs-out",
        default=None,
        metavar="F",
        help="write one CSV row per run segment ('-': stdout)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy
    from shared.sim import simulate, write_jobs_csv
    from shared.sim.offload_jobs import describe_marking
    from shared.sim.share_jobs import describe_shares

    recipe = recipe_of(args)
    recipe.sim_config()  # flags checked before anything is read
    if args.json and args.jobs_out and args.json == args.jobs_out:
        where = "stdout" if args.json == "-" else args.json
        raise UserError(f"--json and --jobs-out both write to {where}: give two places")
    policy = make_policy(args.policy)
    placer = make_placer(args.placer, reproducible=True)
    stats = SkipStats()
    inputs = run_recipe.build_inputs(recipe, stats)
    cluster, jobs = inputs.cluster, inputs.jobs
    require_fields(policy.label, getattr(policy, "needs", ()), jobs, args.trace)
    with _LazyProgress(policy.label) as bar:
        config = dataclasses.replace(inputs.config, **_reclaim_settings(args))
        result = simulate(jobs, cluster, policy, placer, config, bar.tick)
    summary = result.summary()
    summary["settings"] = {"policy": args.policy, **recipe.settings(inputs.load_factor)}
    if args.offload_fraction > 0:
        summary["offload_marking"] = describe_marking(args.offload_fraction, args.seed)
    if args.share_fraction > 0:
        summary["share_marking"] = describe_shares(args.share_fraction, args.seed)
    replace = placer.replace if isinstance(placer, Replacing) else None
    if replace is not None:
        summary["offload_replace"] = replace.describe()
        print(f"{replace.describe()}; {result.replacements} moves", file=sys.stderr)
    if args.jobs_out:
        write_jobs_csv(result.records, args.jobs_out)
    if args.json:
        write_json(summary, args.json)
    rate = len(jobs) / result.wall_s if result.wall_s > 0 else math.inf
    skipped = ", ".join(f"{n} {r}" for r, n in sorted(stats.counts.items())) or "none"
    rejected = sum(result.rejected.values())
    print(
        f"{policy.label}: {summary['jobs']} jobs finished{_timed_out_text(summary)}, "
        f"{rejected} rejected, "
        f"avg JCT {_secs(summary['avg_jct_s'])}, avg queue {_secs(summary['avg_queue_s'])}, "
        f"GPU util {_util_text(summary, jobs)}, discipline "
        f"{args.discipline}{interval_text(args.round_interval)}, priority inversions "
        f"{summary['priority_inversions']}; "
        f"{len(jobs)} jobs in {result.wall_s:.2f} s "
        f"({rate:.0f} jobs/s); trace rows skipped: {skipped}",
        file=sys.stderr,
    )
    return check_outcome(policy.label, len(jobs), summary, jobs, cluster.gpu_types)


def _timed_out_text(summary: dict[str, Any]) -> str:
    """How many of the finished jobs were stopped at their requested time, if any."""
    n = summary.get("timed_out", 0)
    return f" ({n} stopped at their time limit)" if n else ""


def _secs(v: Any) -> str:
    """Seconds as printed on the run's line: n/a where nothing finished (NaN)."""
    return f"{v:.0f} s" if isinstance(v, int | float) and math.isfinite(v) else "n/a"


def interval_text(seconds: float) -> str:
    """The round interval as the runs' lines and tables say it ("" for a round per event)."""
    return f", rounds every {seconds:g} s" if seconds > 0 else ""


def _util_text(summary: dict[str, object], jobs: list[TraceJob]) -> str:
    """`gpu_util` is over the submission span; with every job submitted at one instant
    that span is empty (the summary holds 0.0), so the line says so and gives the
    utilisation over the makespan instead of printing a bare 0."""
    submits = [j.submit_s for j in jobs]
    if submits and max(submits) > min(submits):
        return f"{summary['gpu_util']:.3f} (submission span)"
    return (
        f"n/a over the submission span (every job submitted at one instant), "
        f"{summary['gpu_util_makespan']:.3f} over the makespan"
    )


def recipe_of(args: argparse.Namespace) -> RunRecipe:
    """The run flags (`add_run_args`) as a recipe; a parser that offers only some of them
    (a benchmark's) gets the recipe's defaults for the rest."""
    defaults = RunRecipe(args.trace, args.format, args.cluster or "")
    return RunRecipe(
        trace=args.trace,
        format=args.format,
        cluster=args.cluster or "",
        policy=getattr(args, "policy", None),
        reference=getattr(args, "reference", defaults.reference),
        seed=args.seed,
        limit=getattr(args, "limit", defaults.limit),
        since=getattr(args, "since", defaults.since),
        until=getattr(args, "until", defaults.until),
        load=getattr(args, "load", defaults.load),
        load_basis=getattr(args, "load_basis", defaults.load_basis),
        repeat=getattr(args, "repeat", defaults.repeat),
        placer=getattr(args, "placer", defaults.placer),
        window=getattr(args, "window", defaults.window),
        preempt=getattr(args, "preempt", defaults.preempt),
        discipline=getattr(args, "discipline", defaults.discipline),
        round_interval_s=getattr(args, "round_interval", defaults.round_interval_s),
        offload_fraction=getattr(args, "offload_fraction", defaults.offload_fraction),
        share_fraction=getattr(args, "share_fraction", defaults.share_fraction),
    )


def mark_offload(args: argparse.Namespace, jobs: list[TraceJob]) -> list[TraceJob]:
    """`--offload-fraction`: mark jobs as offloading (seeded), saying how on stderr."""
    return run_recipe.mark_offload(recipe_of(args), jobs)


def sim_config(args: argparse.Namespace) -> SimConfig:
    """The simulator's settings from the run flags, checked (one line)."""
    return dataclasses.replace(recipe_of(args).sim_config(), **_reclaim_settings(args))


def _reclaim_settings(args: argparse.Namespace) -> dict[str, Any]:
    """SimConfig's reclaim fields from the flags (benches without them: defaults)."""
    check_reclaim_args(args, live=False)
    out: dict[str, Any] = {"reclaim": not getattr(args, "no_reclaim", False)}
    for flag, key in (
        ("grace", "grace_s"),
        ("min_run", "min_run_s"),
        ("checkpoint", "checkpoint_s"),
    ):
        v = getattr(args, flag, None)
        if v is not None:
            out[key] = float(v)
    return out


def check_outcome(
    label: str,
    total: int,
    summary: dict[str, Any],
    jobs: Iterable[TraceJob] = (),
    cluster_types: Collection[str] = (),
) -> int:
    """Say on stderr when a run means little: nothing finished (exit status 1) or more
    than half of the jobs rejected (a warning), and any rejection at all (a note); the
    reasons are the summary's `rejected`, with the GPU types asked for that
    `cluster_types` lacks when `jobs` are given."""
    from shared.sim.admit import NO_SUCH_TYPE

    rejected = summary.get("rejected") or {}
    n_rej = sum(rejected.values())
    why = ", ".join(f"{n} {r}" for r, n in rejected.items()) or "no job was rejected"
    if rejected.get(NO_SUCH_TYPE) and cluster_types:
        lacking = unknown_types(jobs, cluster_types)
        if lacking:
            why += (
                f"; jobs ask for {', '.join(lacking)}, the cluster has "
                f"{', '.join(sorted(cluster_types))}"
            )
    if not summary.get("jobs"):
        print(f"error: {label}: no job finished out of {total} ({why})", file=sys.stderr)
        return 1
    if n_rej * 2 > total:
        print(f"warning: {label}: {n_rej} of {total} jobs rejected ({why})", file=sys.stderr)
    elif n_rej:  # fewer, but each rejected job is still one the user may not expect
        print(f"note: {label}: {n_rej} of {total} jobs rejected ({why})", file=sys.stderr)
    return 0


def unknown_types(jobs: Iterable[TraceJob], cluster_types: Collection[str]) -> list[str]:
    """GPU type names jobs ask for (after the mapping onto the cluster's names) that
    none of the cluster's nodes has, most asked for first."""
    have = set(cluster_types)
    count: Counter[str] = Counter()
    for job in jobs:
        if job.gpu_types and not have.intersection(job.gpu_types):
            count.update(job.gpu_types)
    return [t for t, _ in count.most_common()]


class _LazyProgress:
    """A rich progress bar on stderr that appears only once a run has taken a while."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.t0 = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _LazyProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def tick(self, done: int, total: int) -> None:
        if self.bar is None:
            if time.perf_counter() - self.t0 < _PROGRESS_AFTER_S:
                return
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn(f"{self.label:<22}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} jobs"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done)


def load_run_cluster(args: argparse.Namespace) -> ClusterSpec:
    """The `--cluster`, with `--reference` applied if given (`shared.recipe`)."""
    return run_recipe.load_run_cluster(recipe_of(args))


def load_run_jobs(
    args: argparse.Namespace, cluster: ClusterSpec, stats: SkipStats
) -> list[TraceJob]:
    """The trace's jobs submitted in [--since, --until), the first --limit of them, made
    shares, replayed and compressed as the flags say (`shared.recipe`); the factor the
    gaps were divided by is kept in `args.load_factor` for `run_settings`."""
    loaded = run_recipe.load_run_jobs(recipe_of(args), cluster, stats)
    if loaded.load_factor is not None:
        args.load_factor = loaded.load_factor
    return loaded.jobs


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a run's figures depend on besides the policy, as the summary JSON's
    `settings` (`RunRecipe.settings`)."""
    return recipe_of(args).settings(getattr(args, "load_factor", None))


def write_json(summary: dict[str, Any], out: str) -> None:
    """The summary as one JSON object (NaN, e.g. no job finished, written as null)."""
    write_json_file(finite_or_null(summary), out)
