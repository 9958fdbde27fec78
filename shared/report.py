"""Comparison of several simulated runs on one trace: a table (markdown and CSV)
and PNG plots (JCT CDF, queueing delay over time, GPU utilisation over time).
Used by `rltune eval`; plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.metrics import (
    SIZE_BUCKETS,
    JobRecord,
    jct_cdf,
    queue_by_size,
    queue_delay_series,
    utilisation_series,
)

__all__ = ["PolicyRun", "markdown_table", "write_csv", "write_plots"]

DAY = 86400.0


@dataclass(frozen=True)
class PolicyRun:
    label: str  # e.g. "sjf-oracle (oracle)"
    summary: dict[str, object]
    records: list[JobRecord]
    wall_s: float
    total_gpus: int | None = None  # the run's cluster, where runs differ (`whatif`)


COLUMNS = (
    ("policy", "policy"),
    ("discipline", "discipline"),
    ("jobs", "jobs"),
    ("avg_jct_s", "avg JCT (h)"),
    ("p50_jct_s", "p50 JCT (h)"),
    ("p99_jct_s", "p99 JCT (h)"),
    ("avg_queue_s", "avg queue (h)"),
    ("p99_queue_s", "p99 queue (h)"),
    ("max_queue_s", "max queue (h)"),
    ("queue_by_size.16+.avg_s", "16+ GPU avg queue (h)"),
    ("queue_by_size.16+.max_s", "16+ GPU max queue (h)"),
    ("avg_bsld", "avg bsld"),
    ("gpu_util", "GPU util (submit span)"),
    ("gpu_util_makespan", "GPU util (makespan)"),
    ("priority_inversions", "inversions"),
    ("makespan_s", "makespan (d)"),
    ("placement_p50_ms", "place p50 (ms)"),
    ("placement_p99_ms", "place p99 (ms)"),
    ("rejected", "rejected"),
    ("wall_s", "sim wall (s)"),
)


def _cell(key: str, value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "0"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    if key.endswith("_jct_s") or key.endswith("_queue_s") or key.startswith("queue_by_size"):
        return f"{value / 3600:.2f}"
    if key == "makespan_s":
        return f"{value / DAY:.1f}"
    if key in ("avg_bsld", "wall_s"):
        return f"{value:.2f}"
    if key.startswith("gpu_util"):
        return f"{value:.3f}"
    if key.startswith("placement"):
        return f"{value:.3f}"
    return str(value)


def markdown_table(runs: Sequence[PolicyRun]) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join("---" if k == "policy" else "---:" for k, _ in COLUMNS) + "|"
    rows = ["| " + " | ".join(_cell(k, _value(run, k)) for k, _ in COLUMNS) + " |" for run in runs]
    return "\n".join([head, rule, *rows]) + "\n"


def write_csv(runs: Sequence[PolicyRun], path: Path, label: str = "policy") -> None:
    """The same table with the summary JSON's keys and units (seconds), one row per run;
    `label` heads the first column (what a run's label is: a policy, a scenario)."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow([label if k == "policy" else k for k, _ in COLUMNS])
        for run in runs:
            w.writerow([_raw(_value(run, k)) for k, _ in COLUMNS])


def _value(run: PolicyRun, key: str) -> object:
    if key == "policy":
        return run.label
    if key == "wall_s":
        return run.wall_s
    value: object = run.summary
    for part in key.split("."):  # queue_by_size.16+.avg_s
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _raw(v: object) -> object:
    if isinstance(v, dict):
        return ";".join(f"{k}={n}" for k, n in v.items())
    return v


def write_plots(runs: Sequence[PolicyRun], total_gpus: int, out: Path) -> list[Path]:
    """jct_cdf.png, queue_delay.png, gpu_util.png, queue_by_size.png in `out`; returns
    their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min((r.submit_s for run in runs for r in run.records), default=0.0)
    paths = []
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        xs, fr = jct_cdf(run.records)
        if xs:
            ax.step([max(x, 1.0) / 3600 for x in xs], fr, where="post", label=run.label)
    ax.set(
        xscale="log", xlabel="JCT (hours, log scale)", ylabel="fraction of jobs", title="JCT CDF"
    )
    paths.append(_save(fig, ax, out / "jct_cdf.png"))
    span = max((s.finish_s for run in runs for r in run.records for s in r.segments), default=t0)
    last_submit = max((r.submit_s for run in runs for r in run.records), default=t0)
    # bins from the span each plot covers (submissions, resp. the whole run), at least a
    # minute: a trace of minutes, or arrivals compressed into a short span ahead of
    # days-long jobs, still gets points to draw
    q_bin = max(60.0, (last_submit - t0) / 120)
    u_bin = max(60.0, (span - t0) / 120)
    q_scale, q_unit = _unit(last_submit - t0)
    fig, ax = plt.subplots(figsize=(8, 5))
    delays = []
    for run in runs:
        t, q = queue_delay_series(run.records, q_bin)
        delays.append((run.label, t, q))
    d_scale, d_unit = _unit(max((v for _, _, q in delays for v in q), default=0.0))
    for label, t, q in delays:
        ax.plot([(x - t0) / q_scale for x in t], [v / d_scale for v in q], label=label,
                marker="." if len(t) < 30 else None)  # fmt: skip
    ax.set(xlabel=f"submit time ({q_unit})", ylabel=f"mean queueing delay ({d_unit})",
           title=f"Queueing delay of jobs submitted per {_span_text(q_bin)}")  # fmt: skip
    ax.set_ylim(bottom=0)
    paths.append(_save(fig, ax, out / "queue_delay.png"))
    u_scale, u_unit = _unit(span - t0)
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        t, u = utilisation_series(run.records, run.total_gpus or total_gpus, u_bin)
        ax.plot([(x - t0) / u_scale for x in t], u, label=run.label,
                marker="." if len(t) < 30 else None)  # fmt: skip
    ax.set(xlabel=f"time ({u_unit})", ylabel="share of GPUs held", ylim=(0, 1.05),
           title=f"GPU utilisation per {_span_text(u_bin)}")  # fmt: skip
    paths.append(_save(fig, ax, out / "gpu_util.png"))
    fig, ax = plt.subplots(figsize=(8, 5))
    width = 0.8 / max(len(runs), 1)
    sizes = [queue_by_size(r for r in run.records if r.finished) for run in runs]
    b_scale, b_unit = _unit(
        max((b[name]["avg_s"] for b in sizes for name, _, _ in SIZE_BUCKETS
             if b[name]["jobs"]), default=0.0)
    )  # fmt: skip
    for i, (run, by_size) in enumerate(zip(runs, sizes, strict=True)):
        ys = [
            by_size[name]["avg_s"] / b_scale if by_size[name]["jobs"] else 0.0
            for name, _, _ in SIZE_BUCKETS
        ]
        ax.bar([k + i * width for k in range(len(ys))], ys, width, label=run.label)
    names = [name for name, _, _ in SIZE_BUCKETS]
    for k, name in enumerate(names):  # an empty bucket is not a bucket that waited 0
        if not any(b[name]["jobs"] for b in sizes):
            ax.text(k + 0.4 - width / 2, 0, "no jobs", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(names))], names)
    ax.set(xlabel="GPUs requested", ylabel=f"mean queueing delay ({b_unit})",
           title="Queueing delay by job size")  # fmt: skip
    ax.set_ylim(bottom=0)
    paths.append(_save(fig, ax, out / "queue_by_size.png"))
    return paths


def _unit(seconds: float) -> tuple[float, str]:
    """The unit a span of `seconds` reads best in: days from 2 days, hours from 2
    hours, else minutes (its size in seconds, its name)."""
    if seconds >= 2 * DAY:
        return DAY, "days"
    if seconds >= 2 * 3600:
        return 3600.0, "hours"
    return 60.0, "minutes"


def _span_text(seconds: float) -> str:
    scale, unit = _unit(seconds)
    return f"{seconds / scale:.1f} {unit.rstrip('s') if seconds == scale else unit}"


def _save(fig: object, ax: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    ax.grid(True, alpha=0.3)  # type: ignore[attr-defined]
    ax.legend(fontsize=8)  # type: ignore[attr-defined]
    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path
