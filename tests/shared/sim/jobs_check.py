"""An independent reading of a `--jobs-out` file for the tests: every invariant the
simulator promises, checked from the CSV alone."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Any


def violations(path: Path) -> list[str]:
    """What is wrong with a jobs-out file: GPUs held twice, starts before submit, ..."""
    bad: list[str] = []
    held: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if not row["start_s"]:
                continue
            sub, st, fin = float(row["submit_s"]), float(row["start_s"]), float(row["finish_s"])
            if st < sub:
                bad.append(f"{row['job_id']} starts at {st} before its submit {sub}")
            if fin < st:
                bad.append(f"{row['job_id']} finishes before it starts")
            milli = int(row["gpu_milli"])
            count = 0
            for part in row["nodes"].split(";"):
                node, idxs = part.rsplit(":", 1)
                for i in idxs.split("+"):
                    held[(node, i)] += [(st, milli), (fin, -milli)]
                    count += 1
            if count != int(row["num_gpus"]):
                bad.append(f"{row['job_id']} holds {count} GPUs, asked for {row['num_gpus']}")
    for gpu, events in held.items():
        load = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # releases first
            load += delta
            if load > 1000:
                bad.append(f"GPU {gpu} held {load} milli at once")
                break
    return bad


def recompute(path: Path, total_gpus: int) -> dict[str, Any]:
    """The utilisation and queueing figures of DESIGN.md from the CSV alone, written
    from the definitions without shared.metrics: gpu_util (inside the submission
    span), gpu_util_makespan, max_queue_s and queue_by_size."""
    submit: dict[str, float] = {}
    first_start: dict[str, float] = {}
    size: dict[str, int] = {}
    segs: list[tuple[float, float, float]] = []  # (start, finish, GPUs held)
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            job = row["job_id"]
            submit[job] = float(row["submit_s"])
            size[job] = int(row["num_gpus"])
            if row["start_s"]:
                st, fin = float(row["start_s"]), float(row["finish_s"])
                first_start[job] = min(first_start.get(job, st), st)
                segs.append((st, fin, int(row["num_gpus"]) * int(row["gpu_milli"]) / 1000))
    t0, t1 = min(submit.values()), max(submit.values())
    end = max(f for _, f, _ in segs)
    inside = sum(g * max(0.0, min(f, t1) - max(s, t0)) for s, f, g in segs)
    held = sum(g * (f - s) for s, f, g in segs)
    delays = {job: first_start[job] - submit[job] for job in first_start}
    buckets: dict[str, list[float]] = {"1": [], "2-7": [], "8-15": [], "16+": []}
    for job, d in delays.items():
        k = size[job]
        name = "1" if k <= 1 else "2-7" if k < 8 else "8-15" if k < 16 else "16+"
        buckets[name].append(d)
    return {
        "gpu_util": inside / (total_gpus * (t1 - t0)) if t1 > t0 else 0.0,
        "gpu_util_makespan": held / (total_gpus * (end - t0)),
        "max_queue_s": max(delays.values()),
        "queue_by_size": {
            name: {
                "avg_s": sum(xs) / len(xs) if xs else None,
                "max_s": max(xs) if xs else None,
                "jobs": len(xs),
            }
            for name, xs in buckets.items()
        },
    }


def recompute_offload(path: Path) -> dict[str, float]:
    """The offload figures (shared/offload_metrics.py) from the CSV alone, from their
    definitions: over finished jobs with a `param_bytes`, mean JCT, mean added
    migration time, and added / (held − added)."""
    jobs: dict[str, list[float]] = {}  # job -> [submit, last finish, held, added]
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if not row.get("param_bytes") or not row["start_s"]:
                continue
            st, fin = float(row["start_s"]), float(row["finish_s"])
            added = float(row["offload_s"])
            if not 0.0 <= added <= fin - st + 1e-6:
                raise AssertionError(f"{row['job_id']}: offload_s {added} outside its segment")
            j = jobs.setdefault(row["job_id"], [float(row["submit_s"]), fin, 0.0, 0.0])
            j[1] = max(j[1], fin)
            j[2] += fin - st
            j[3] += added
    n = len(jobs)
    if not n:
        return {"offload_jobs": 0}
    held = sum(j[2] for j in jobs.values())
    added = sum(j[3] for j in jobs.values())
    return {
        "offload_jobs": n,
        "offload_avg_jct_s": sum(j[1] - j[0] for j in jobs.values()) / n,
        "offload_migration_s": added / n,
        "offload_slowdown": added / (held - added),
    }
