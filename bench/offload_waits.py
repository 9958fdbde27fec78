"""`python -m bench.offload_waits BASE.csv OTHER.csv [...]`: where the jobs that do
not offload gain or lose wait between two runs of the same jobs (per-job CSVs that
`--jobs-out` writes, for example `milp.csv` and `milp+offload+replace.csv` of one
marking seed).

A job's wait is its first segment's start minus its submit time (the time it
first waited; a moved offloading job's later segments do not count, and the jobs
that offload are left out: they are what the placers are for). Printed (markdown):
per size group (1 GPU, 2-7, 8+) the jobs, the mean wait in both runs and its
change, and their share of the change of the avg JCT of the jobs that do not
offload (wait change summed over the group / jobs that do not offload; the rest
of the JCT change is run time: moved jobs finishing later or sooner do not enter
here, only waits); then the `--days` submit days (UTC) whose jobs' summed wait
changed most, each split into the 1-GPU jobs and the rest; last, each run's
GPU-hours of checkpoint restore after moves (Σ restart_s × GPUs) and of unhidden
migrations (Σ offload_s × GPUs): what moves cost the cluster and give back. The
pattern these show at marking seeds 6, 8, 9 (8+ GPU jobs start hours sooner,
1-GPU jobs submitted on a few busy days hours later) is traced in
docs/results/offload-replace-queue.md.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from shared.errors import UserError

__all__ = ["GROUPS", "Job", "gpu_hours", "group", "load", "main", "summary"]

GROUPS = ("1", "2-7", "8+")


@dataclass(frozen=True)
class Job:
    submit_s: float
    start_s: float  # first segment's start
    num_gpus: int
    offloads: bool


def group(num_gpus: int) -> str:
    return "1" if num_gpus == 1 else "2-7" if num_gpus < 8 else "8+"


def load(path: str | Path) -> dict[str, Job]:
    """Each job's submit, first start, GPUs and whether it offloads, from a per-job CSV
    (rows of one job in segment order; unfinished jobs have no row)."""
    out: dict[str, Job] = {}
    try:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                jid = r["job_id"]
                start = float(r["start_s"])
                old = out.get(jid)
                if old is None or start < old.start_s:
                    out[jid] = Job(
                        float(r["submit_s"]), start, int(r["num_gpus"]), bool(r["param_bytes"])
                    )
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"cannot read {path} as a per-job CSV: {exc}") from exc
    return out


def gpu_hours(path: str | Path) -> tuple[float, float]:
    """(restore, migration) GPU-hours of a per-job CSV: Σ restart_s × GPUs and
    Σ offload_s × GPUs over its segments (empty cells: 0)."""
    restore = migration = 0.0
    try:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                g = int(r["num_gpus"])
                restore += float(r["restart_s"] or 0.0) * g
                migration += float(r["offload_s"] or 0.0) * g
    except (OSError, KeyError, ValueError) as exc:
        raise UserError(f"cannot read {path} as a per-job CSV: {exc}") from exc
    return restore / 3600, migration / 3600


def summary(
    base: dict[str, Job], other: dict[str, Job], days: int = 5
) -> tuple[dict[str, dict[str, float]], list[tuple[str, dict[str, float]]]]:
    """(per group: jobs, mean wait in each run, change in hours, change of the avg JCT
    of all jobs that do not offload from this group's waits in seconds; the `days`
    submit days with the largest summed |change|: 1-GPU and other jobs' summed change
    in hours and job counts). Jobs in both runs only."""
    keys = [k for k, j in base.items() if not j.offloads and k in other]
    n = len(keys)
    acc: dict[str, list[float]] = {g: [0.0, 0.0, 0.0] for g in GROUPS}  # jobs, base, other
    by_day: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for k in keys:
        b, o = base[k], other[k]
        wb, wo = b.start_s - b.submit_s, o.start_s - o.submit_s
        a = acc[group(b.num_gpus)]
        a[0] += 1
        a[1] += wb
        a[2] += wo
        day = datetime.fromtimestamp(b.submit_s, UTC).strftime("%Y-%m-%d")
        d = by_day[day]
        i = 0 if b.num_gpus == 1 else 2
        d[i] += (wo - wb) / 3600
        d[i + 1] += 1
    groups = {}
    for g, (m, wb, wo) in acc.items():
        groups[g] = {
            "jobs": m,
            "base_h": wb / m / 3600 if m else 0.0,
            "other_h": wo / m / 3600 if m else 0.0,
            "change_h": (wo - wb) / m / 3600 if m else 0.0,
            "jct_part_s": (wo - wb) / n if n else 0.0,
        }
    top = sorted(by_day.items(), key=lambda kv: -abs(kv[1][0] + kv[1][2]))[:days]
    out_days = [
        (day, {"one_h": d[0], "one_jobs": d[1], "rest_h": d[2], "rest_jobs": d[3]})
        for day, d in sorted(top)
    ]
    return groups, out_days


def table(groups: dict[str, dict[str, float]], days: list[tuple[str, dict[str, float]]]) -> str:
    lines = [
        "| GPUs | jobs | mean wait h (base) | (other) | change h | avg JCT change s from it |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for g, r in groups.items():
        lines.append(
            f"| {g} | {r['jobs']:.0f} | {r['base_h']:.2f} | {r['other_h']:.2f} "
            f"| {r['change_h']:+.2f} | {r['jct_part_s']:+.0f} |"
        )
    lines += [
        "",
        "| submitted (UTC) | 1-GPU jobs | their wait change, h summed | other jobs "
        "| their wait change, h summed |",
        "|---|---:|---:|---:|---:|",
    ]
    for day, d in days:
        lines.append(
            f"| {day} | {d['one_jobs']:.0f} | {d['one_h']:+.0f} | {d['rest_jobs']:.0f} "
            f"| {d['rest_h']:+.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.offload_waits", description=__doc__)
    p.add_argument("base", help="per-job CSV of the run compared against (e.g. milp.csv)")
    p.add_argument("others", nargs="+", help="per-job CSVs of the same jobs under other runs")
    p.add_argument("--days", type=int, default=5, help="submit days listed (default 5)")
    a = p.parse_args(argv)
    try:
        base = load(a.base)
        for path in a.others:
            print(f"\n{path} against {a.base}:\n")
            print(table(*summary(base, load(path), a.days)))
        print("\n| run | restore GPU-h | migration GPU-h |\n|---|---:|---:|")
        for path in (a.base, *a.others):
            restore, migration = gpu_hours(path)
            print(f"| {path} | {restore:.1f} | {migration:.0f} |")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
