"""`rltune bench offload_placement`: placers with and without the offload term, side
by side on one trace slice with a seeded share of the jobs offloading.

Every placer runs the same jobs (the same marking: `--fraction`, `--seed`, the
distribution of shared/sim/offload_jobs.py, printed) under the same policy and
discipline. Printed per placer: avg JCT of all jobs and of the offloading ones,
their mean migration time and `offload_slowdown` (run time added by migrations
compute did not hide / run time without it), priority inversions; then each
offload-aware placer against its unaware twin. `--out DIR` writes the table as
JSON and a bar plot (offload_placement.png). `--policies` runs every placer under
each policy (rows "policy / placer"; a learned one as `rl:PATH`), `--since` /
`--until` pick the slice as `rltune simulate` does (each run's wall and CPU
seconds are in the JSON: `wall_s`, `cpu_s`), and `--jobs-out DIR` writes
each run's per-job CSV and summary JSON (as `simulate --jobs-out`, `--json`): every
figure of the table is recomputed from the CSV (tests/shared/sim/jobs_check.py,
../shared/tools/check_jobs.py).

`NAME+offload+replace` also moves running offloading jobs that have run long
(services/placement/replace.py); its settings are the `--replace-*` flags, printed
with the marking, and it is compared with both `NAME+offload` and `NAME`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

from rltune.simulate import load_run_jobs
from services.placement.registry import OFFLOAD_SUFFIX, REPLACE_SUFFIX, make_placer
from services.scoring.policies import make_policy
from shared.cluster import load_cluster
from shared.errors import UserError
from shared.jsonfile import write_json
from shared.metrics import JobRecord
from shared.sched.replacement import QUEUE_CHECKS, ReplaceConfig
from shared.sim import SimConfig, simulate, write_jobs_csv
from shared.sim.offload_jobs import describe_marking, mark_offloading
from shared.traces import SkipStats

__all__ = ["main"]

KEYS = (
    "avg_jct_s",
    "others_avg_jct_s",
    "offload_avg_jct_s",
    "offload_migration_s",
    "offload_slowdown",
)
_DEFAULT = ReplaceConfig()


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rltune bench offload_placement", description=__doc__)
    p.add_argument("--trace", default="../shared/traces/philly/philly-sep-oct.csv")
    p.add_argument("--format", default="philly")
    p.add_argument("--cluster", default="clusters/philly.yaml")
    p.add_argument("--limit", type=int, default=8000, help="first N jobs by submit time")
    p.add_argument("--since", default="", help="only jobs submitted from then (as simulate)")
    p.add_argument("--until", default="", help="only jobs submitted before then")
    p.add_argument("--jobs-out", default=None, help="directory for each run's per-job CSV")
    p.add_argument("--fraction", type=float, default=0.3, help="share of jobs offloading")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policies", default="fifo", help="comma-separated; each runs every placer")
    p.add_argument("--discipline", default="easy")
    p.add_argument("--placers", default="greedy,greedy+offload,milp,milp+offload")
    p.add_argument("--out", default=None, help="directory for the JSON and the plot")
    g = p.add_argument_group("re-placement (NAME+offload+replace; services/placement/replace.py)")
    g.add_argument(
        "--replace-after",
        type=float,
        default=_DEFAULT.after,
        help="candidate after this many times its run-time estimate",
    )
    g.add_argument(
        "--replace-min-run-h",
        type=float,
        default=_DEFAULT.min_run_s / 3600,
        help="... and at least this many hours",
    )
    g.add_argument(
        "--replace-expect",
        type=float,
        default=_DEFAULT.expect,
        help="expected remaining run time as a multiple of elapsed",
    )
    g.add_argument("--replace-min-gain", type=float, default=_DEFAULT.min_gain)
    g.add_argument("--replace-payback", type=float, default=_DEFAULT.payback)
    g.add_argument(
        "--restart-s",
        type=float,
        default=_DEFAULT.restart_s,
        help="fixed restart overhead of a move, seconds",
    )
    g.add_argument("--replace-idle-only", action="store_true", help="move only while no job waits")
    g.add_argument(
        "--replace-settle-h",
        type=float,
        default=_DEFAULT.settle_s / 3600,
        help="a moved job stays at least this many hours where it was moved",
    )
    g.add_argument(
        "--replace-queue-check",
        choices=QUEUE_CHECKS,
        default=_DEFAULT.queue_check,
        help="plan the queue without and with each move; pareto: no planned start later, "
        "total: their sum not larger (replace.py)",
    )
    g.add_argument(
        "--replace-queue-window",
        type=int,
        default=_DEFAULT.queue_window,
        help="waiting jobs (arrival order) the queue check plans",
    )
    g.add_argument(
        "--checkpoint-gbps",
        type=float,
        default=_DEFAULT.net_gbps,
        help="checkpoint write and read bandwidth, GB/s",
    )
    return p.parse_args(argv)


def _replace_config(a: argparse.Namespace) -> ReplaceConfig:
    flags = ("replace_after", "replace_min_run_h", "replace_expect", "replace_min_gain",
             "replace_payback", "restart_s", "checkpoint_gbps", "replace_settle_h",
             "replace_queue_window")  # fmt: skip
    for flag in flags:
        if getattr(a, flag) < 0:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 0")
    return ReplaceConfig(
        after=a.replace_after, min_run_s=a.replace_min_run_h * 3600, expect=a.replace_expect,
        min_gain=a.replace_min_gain, payback=a.replace_payback, restart_s=a.restart_s,
        net_gbps=a.checkpoint_gbps or _DEFAULT.net_gbps, idle_only=a.replace_idle_only,
        settle_s=a.replace_settle_h * 3600, queue_check=a.replace_queue_check,
        queue_window=a.replace_queue_window,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    a = _parse(argv)
    placers = [n.strip() for n in a.placers.split(",") if n.strip()]
    policies = [n.strip() for n in a.policies.split(",") if n.strip()]
    replace = _replace_config(a)
    for name in placers:
        make_placer(name)  # every name checked before the long runs
    for name in policies:
        make_policy(name)
    console = Console(stderr=True)
    cluster = load_cluster(a.cluster)
    jobs = load_run_jobs(a, cluster, SkipStats())
    jobs = mark_offloading(jobs, a.fraction, a.seed)
    marking = describe_marking(a.fraction, a.seed)
    console.print(marking)
    replacing = any(n.endswith(REPLACE_SUFFIX) for n in placers)
    if replacing:
        console.print(replace.describe())
    config = SimConfig(seed=a.seed, discipline=a.discipline)
    rows: dict[str, dict[str, Any]] = {}
    runs = [(pol, name) for pol in policies for name in placers]
    with Progress(console=console, transient=True) as bar:
        for pol, name in runs:
            label = name if len(policies) == 1 else f"{pol} / {name}"
            task = bar.add_task(f"{pol} / {name}", total=len(jobs))

            def tick(done: int, _total: int, task: TaskID = task) -> None:
                bar.update(task, completed=done)

            placer = make_placer(name, reproducible=True, replace=replace)
            cpu = time.process_time()
            res = simulate(jobs, cluster, make_policy(pol), placer, config, tick)
            cpu = time.process_time() - cpu
            s = res.summary()
            if not s.get("offload_jobs"):
                raise UserError("no offloading job finished: raise --fraction or --limit")
            s["others_avg_jct_s"] = others_avg_jct_s(res.records)
            rows[label] = {k: s[k] for k in (*KEYS, "offload_jobs", "priority_inversions")}
            rows[label]["wall_s"] = round(res.wall_s, 1)
            rows[label]["cpu_s"] = round(cpu, 2)  # this process's CPU time for the run
            rows[label]["replacements"] = res.replacements
            rows[label]["offload_restart_s"] = s.get("offload_restart_s", 0.0)
            if a.jobs_out:
                Path(a.jobs_out).mkdir(parents=True, exist_ok=True)
                safe = "".join(c if c.isalnum() or c in "+-." else "_" for c in label)
                write_jobs_csv(res.records, Path(a.jobs_out) / f"{safe}.csv")
                write_json(res.summary(), str(Path(a.jobs_out) / f"{safe}.json"))
    result = {"marking": marking, "trace": a.trace, "limit": a.limit, "since": a.since,
              "until": a.until, "policies": policies, "discipline": a.discipline,
              "cluster": a.cluster, "placers": rows, "versus": _versus(rows)}  # fmt: skip
    if replacing:
        result["replace"] = replace.describe()
    print_table(console, result)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(result, str(out / "offload_placement.json"))
        title = f"{', '.join(policies)}, {a.discipline}, {len(jobs)} jobs"
        _plot(rows, out / "offload_placement.png", title)
    return 0


def others_avg_jct_s(records: Sequence[JobRecord]) -> float:
    """The mean JCT of the finished jobs that do not offload (0 if there are none): the
    group the summary's `avg_jct_s` and `offload_avg_jct_s` leave out."""
    others = [r.jct_s for r in records if r.finished and not r.param_bytes]
    return sum(others) / len(others) if others else 0.0


def _versus(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each aware placer against its unaware twin: relative change of every key."""
    out = {}
    for name, r in rows.items():
        bare = name.removesuffix(REPLACE_SUFFIX)
        twins = [bare] if bare != name else []  # NAME+offload+replace: vs NAME+offload ...
        twins.append(bare.removesuffix(OFFLOAD_SUFFIX))  # "policy / placer": the same policy
        for twin in twins:
            if name != twin and twin in rows:
                base = rows[twin]
                out[f"{name} vs {twin}"] = {
                    k: round(r[k] / base[k] - 1, 4) for k in KEYS if base[k]
                }
    return out


def print_table(console: Console, result: dict[str, Any]) -> None:
    pols = ", ".join(result["policies"])
    t = Table(title=f"offload placement ({pols}, {result['discipline']})")
    for col in ("placer", "avg JCT s", "others avg JCT s", "offloading avg JCT s",
                "migration s / job", "offload slowdown", "inversions"):  # fmt: skip
        t.add_column(col, justify="right", no_wrap=col == "placer")
    for name, r in result["placers"].items():
        t.add_row(
            name, f"{r['avg_jct_s']:.0f}", f"{r['others_avg_jct_s']:.0f}",
            f"{r['offload_avg_jct_s']:.0f}",
            f"{r['offload_migration_s']:.0f}", f"{r['offload_slowdown']:.3f}",
            str(r["priority_inversions"]),
        )  # fmt: skip
    t.caption = "   ".join(
        f"{pair}: slowdown {v['offload_slowdown']:+.1%}, avg JCT {v['avg_jct_s']:+.1%} "
        f"(others {v['others_avg_jct_s']:+.1%}, offloading {v['offload_avg_jct_s']:+.1%})"
        for pair, v in result["versus"].items()
    )
    Console(width=132).print(t)


def _plot(rows: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, label in zip(
        axes, ("offload_slowdown", "offload_avg_jct_s", "avg_jct_s"),
        ("migration slowdown (offloading jobs)", "avg JCT s, offloading jobs", "avg JCT s, all"),
        strict=True,
    ):  # fmt: skip
        ax.bar(names, [rows[n][key] for n in names], color="tab:blue")
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
