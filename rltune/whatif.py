"""`rltune whatif`: one trace under variants of the cluster, its queues, the arrivals
or the scheduler, each against the same base run; a table of the figures and their
change from the base, and with `--out DIR` the plots `eval` draws.

Each `--vary` is one scenario (KEY=VALUE changes joined by commas, applied
together; the keys are in `shared.whatif`). Every scenario runs the one simulator
with the same seed, so a difference is the change's, not chance's. `--load L`
compresses the arrivals once, to offered load L of the base's cluster, and every
scenario replays those arrival times (unless it has its own `load=`), so a scenario
with less capacity has a higher offered load.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

from rltune.common import finite_or_null, out_dir
from rltune.simulate import (
    add_run_args,
    check_outcome,
    interval_text,
    load_run_cluster,
    load_run_jobs,
    mark_offload,
    sim_config,
)
from shared.cluster import ClusterSpec
from shared.traces import SkipStats, TraceJob
from shared.whatif import KEYS, Scenario, apply, parse_variant, scenario_jobs

__all__ = ["register", "run"]

# (summary key, title, scale): the columns, and which show their change from the base
_FIGURES = (
    ("avg_jct_s", "avg JCT (h)", 3600.0),
    ("p99_jct_s", "p99 JCT (h)", 3600.0),
    ("avg_queue_s", "avg queue (h)", 3600.0),
    ("p99_queue_s", "p99 queue (h)", 3600.0),
    ("max_queue_s", "max queue (h)", 3600.0),
    ("avg_bsld", "avg bsld", 1.0),
    ("gpu_util", "GPU util (submit span)", 1.0),
)
# change from the base: in percent, or in hours for the queueing delay (often ~0 in the base)
_DELTAS = {"avg_jct_s": "%", "avg_queue_s": "h", "avg_bsld": "%"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "whatif", help="the same trace under variants of the cluster, queues or policy"
    )
    add_run_args(p)
    _set_help(
        p,
        "--load",
        "compress the submission times once, for the base (every gap divided by one "
        "factor, printed), so that the base's sum(GPUs x duration) / (submission span x "
        "capacity) = L; every scenario replays those arrival times, so its offered load "
        "is L x the base's capacity / its own (a variant's load=L compresses its own)",
    )
    p.add_argument("--policy", required=True, help="the base run's policy (fifo, drf, rl, ...)")
    p.add_argument(
        "--vary",
        action="append",
        required=True,
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help=f"one scenario (repeat for more); keys: {', '.join(KEYS)}",
    )
    p.add_argument(
        "--json", default=None, metavar="OUT", help="write every run's summary ('-': stdout)"
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="also write summary.md, summary.csv, the plots and jobs-<n>.csv per scenario",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy
    from shared.report import PolicyRun
    from shared.sim import SimConfig, simulate
    from shared.sim.load import offered_load

    sim_config(args)  # the shared flags checked (window, round interval)
    base = Scenario(load_run_cluster(args), args.policy, args.placer, args.discipline, args.window)
    scenarios = [base] + [apply(base, parse_variant(v)) for v in args.vary]
    for s in scenarios:  # every name checked before any long run
        make_policy(s.policy)
        make_placer(s.placer, reproducible=True)
    out = out_dir(args.out) if args.out else None
    stats = SkipStats()
    traces = _TraceCache(args, stats, base.cluster)
    console = Console(stderr=True)
    runs: list[tuple[Scenario, PolicyRun, float]] = []
    columns = (
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} jobs"),
        TimeElapsedColumn(),
    )
    trace = [  # (checked first)
        scenario_jobs(traces.jobs(s.cluster), s, args.load_basis) for s in scenarios
    ]
    if traces.factor is not None:
        print(
            f"--load {args.load} ({args.load_basis}): submission gaps divided by "
            f"{traces.factor:.4g} for the base; "
            "every scenario replays those arrivals",
            file=sys.stderr,
        )
    with Progress(*columns, console=console, transient=False) as bar:
        for i, (s, jobs) in enumerate(zip(scenarios, trace, strict=True)):
            task = bar.add_task(_short(s.label, 28), total=len(jobs))

            def tick(done: int, total: int, task: TaskID = task) -> None:
                bar.update(task, completed=done)

            config = SimConfig(
                window=s.window,
                seed=args.seed,
                preempt=args.preempt,
                discipline=s.discipline,
                round_interval_s=args.round_interval,
            )
            placer = make_placer(s.placer, reproducible=True)
            result = simulate(jobs, s.cluster, make_policy(s.policy), placer, config, tick)
            summary = result.summary()
            pr = PolicyRun(s.label, summary, result.records, result.wall_s, s.cluster.total_gpus)
            runs.append((s, pr, offered_load(jobs, s.cluster)))
            if out is not None:
                from shared.sim import write_jobs_csv

                write_jobs_csv(result.records, out / f"jobs-{i}.csv")
    table = comparison_table([(s, pr.summary, load) for s, pr, load in runs])
    head = _preamble(args, stats, traces.factor)
    sys.stdout.write(head + table)
    if args.json:
        from rltune.common import write_json

        write_json(_json(args, runs, traces.factor), args.json)
    if out is not None:
        from shared.report import write_csv, write_plots

        (out / "summary.md").write_text(head + table)
        write_csv([pr for _, pr, _ in runs], out / "summary.csv", label="scenario")
        plots = write_plots([pr for _, pr, _ in runs], base.cluster.total_gpus, out)
        names = ", ".join(p.name for p in plots)
        console.print(f"wrote {out / 'summary.md'}, summary.csv, {names}")
    return max(
        check_outcome(pr.label, len(jobs), pr.summary, jobs, s.cluster.gpu_types)
        for (s, pr, _), jobs in zip(runs, trace, strict=True)
    )


def comparison_table(rows: Sequence[tuple[Scenario, dict[str, Any], float]]) -> str:
    """Markdown: one row per scenario (the base first), each figure with its change from
    the base's for the averages of `_DELTAS` (percent, or hours for the queueing delay)."""
    titles = ["scenario", "GPUs", "offered load", "jobs"]
    for key, title, _ in _FIGURES:
        titles.append(title)
        if key in _DELTAS:
            titles.append("vs base")
    lines = ["| " + " | ".join(titles) + " |", "|---|" + "---:|" * (len(titles) - 1)]
    base = rows[0][1]
    for s, summary, load in rows:
        cells = [s.label, str(s.cluster.total_gpus), f"{load:.3f}", str(summary.get("jobs", 0))]
        for key, _, scale in _FIGURES:
            v = _num(summary.get(key))
            cells.append("-" if v is None else _fmt(key, v / scale))
            if key in _DELTAS:
                unit = _DELTAS[key]
                cells.append(_delta(_num(base.get(key)), v, unit) if s is not rows[0][0] else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _num(v: object) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _fmt(key: str, v: float) -> str:
    return f"{v:.3f}" if key == "gpu_util" else f"{v:.2f}"


def _delta(base: float | None, v: float | None, unit: str) -> str:
    if base is None or v is None:
        return "-"
    if unit == "h":
        return f"{(v - base) / 3600:+.2f} h"
    return f"{(v - base) / base * 100:+.1f}%" if base else "-"


def _set_help(p: argparse.ArgumentParser, flag: str, text: str) -> None:
    """Reword a shared flag's help for this command."""
    for action in p._actions:
        if flag in action.option_strings:
            action.help = text


class _TraceCache:
    """The trace read once per set of GPU types (all that reading depends on: the
    mapping of the trace's type names), offload marking applied as `simulate` does.
    With `--load`, every version's arrivals are compressed for the *base's* cluster:
    the same factor and times for every scenario (`factor`, None without `--load`)."""

    def __init__(self, args: argparse.Namespace, stats: SkipStats, base: ClusterSpec) -> None:
        self.load: float | None = args.load
        self.basis: str = args.load_basis
        self.args = argparse.Namespace(**{**vars(args), "load": None})  # (compressed here)
        self.stats = stats
        self.base = base
        self.factor: float | None = None
        self.cache: dict[tuple[str, ...], list[TraceJob]] = {}

    def jobs(self, cluster: ClusterSpec) -> list[TraceJob]:
        from shared.sim.load import compress_to_load

        key = cluster.gpu_types
        if key not in self.cache:
            stats = self.stats if not self.cache else SkipStats()  # (counted once)
            jobs = load_run_jobs(self.args, cluster, stats)
            if self.load is not None:  # (the factor depends on sizes, durations, arrivals)
                jobs, self.factor = compress_to_load(jobs, self.base, self.load, self.basis)
            self.cache[key] = mark_offload(self.args, jobs)
        return self.cache[key]


def _json(
    args: argparse.Namespace, runs: Sequence[tuple[Scenario, Any, float]], factor: float | None
) -> dict[str, Any]:
    return {
        "settings": {
            "trace": args.trace,
            "format": args.format,
            "cluster": args.cluster,
            "policy": args.policy,
            "placer": args.placer,
            "discipline": args.discipline,
            "window": args.window,
            "seed": args.seed,
            "load": args.load,
            "load_basis": args.load_basis,
            "repeat": args.repeat,
            "load_factor": factor,  # submission gaps divided by this, for every scenario
        },
        "scenarios": [
            {
                "scenario": s.label,
                "changes": [list(c) for c in s.changes],
                "gpus": s.cluster.total_gpus,
                "offered_load": load,
                "summary": finite_or_null(pr.summary),
            }
            for s, pr, load in runs
        ],
    }


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _preamble(args: argparse.Namespace, stats: SkipStats, factor: float | None) -> str:
    skipped = ", ".join(f"{k} {r}" for r, k in sorted(stats.counts.items())) or "none"
    return (
        f"Trace `{args.trace}` ({args.format}; rows skipped: {skipped}) on `{args.cluster}`; "
        f"base: policy `{args.policy}`, placer `{args.placer}`, discipline "
        f"`{args.discipline}`, window {args.window}, seed {args.seed}"
        f"{interval_text(args.round_interval)}"
        f"{_load_text(args.load, args.load_basis, factor)}. Offered load: the scenario's "
        "GPU-time asked per second of its submission span over its capacity.\n\n"
    )


def _load_text(load: float | None, basis: str, factor: float | None) -> str:
    if load is None or factor is None:
        return ""
    return (
        f", load {load} ({basis}; submission gaps divided by {factor:.4g}, once for the base; "
        "every scenario replays those arrivals)"
    )
