"""SenseTime Helios reader (`--format helios`): `cluster_log.csv` of S-Lab/HeliosData.

    job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue

Times are `YYYY-MM-DD HH:MM:SS` (read as UTC) or seconds; `duration` is the run
time in seconds. Helios names no GPU type, so jobs may run on any type.
Skipped and counted: CPU-only jobs ("zero GPUs"), jobs still running or with
no duration ("unfinished"), rows that do not parse ("bad row").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from shared.traces import SkipStats, TraceJob
from shared.traces._io import csv_jobs, finite, parse_time

__all__ = ["read_helios"]

_REQUIRED = ("job_id", "gpu_num", "submit_time", "duration")
_UNFINISHED = {"RUNNING", "PENDING", "REQUEUED", "SUSPENDED"}


def read_helios(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    return csv_jobs(path, _REQUIRED, "a Helios cluster_log.csv", lambda row: _job_of(row, stats))


def _job_of(row: dict[str, str], stats: SkipStats) -> TraceJob | None:
    example = ",".join(str(v) for v in row.values())
    if None in row or any(v is None for v in row.values()):
        stats.skip("bad row", example)
        return None
    state = (row.get("state") or "").strip().upper()
    if state in _UNFINISHED or not (row["duration"] or "").strip():
        stats.skip("unfinished", example)
        return None
    try:
        gpus = int(float(row["gpu_num"]))
        submit = parse_time(row["submit_time"])
        duration = finite(float(row["duration"]))
    except ValueError:
        stats.skip("bad row", example)
        return None
    if gpus == 0:
        stats.skip("zero GPUs", example)
        return None
    if gpus < 0 or duration < 0 or not row["job_id"]:
        stats.skip("bad row", example)
        return None
    return TraceJob(
        row["job_id"], submit, duration, gpus, user=row.get("user") or "", vc=row.get("vc") or ""
    )
