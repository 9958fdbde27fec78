"""Alibaba PAI 2020 reader (`--format alibaba2020`): `pai_job_table` joined with
`pai_task_table` (alibaba/clusterdata `cluster-trace-gpu-v2020`).

The public CSVs have no header (one is accepted if present); columns:

    pai_job_table:  job_name,inst_id,user,status,start_time,end_time
    pai_task_table: job_name,task_name,inst_num,status,start_time,end_time,
                    plan_cpu,plan_mem,plan_gpu,gpu_type

`--trace` names the job table (the task table is `pai_task_table.csv` beside
it) or the directory holding both. A job's GPUs = sum over its tasks of
inst_num x plan_gpu / 100 (plan_gpu is percent of one GPU per instance); a
total under one GPU is a sharing job of that many milli-GPUs, anything above is
rounded up to whole GPUs. Submit = the job's start_time (PAI records submission
there); duration = last task end - first task start; allowed types = the tasks'
`gpu_type`s (MISC, T4, P100, V100, V100M32; empty = any).

The task table is read first and aggregated per job (GPU tasks only); the job
table is then streamed. Skipped and counted: jobs with no GPU task ("zero
GPUs"), jobs not Terminated/Failed or with a missing time ("unfinished"), rows
that do not parse ("bad row").
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from shared.errors import UserError
from shared.traces import SkipStats, TraceJob
from shared.traces._io import finite, open_text

__all__ = ["read_alibaba2020"]

_JOB_COLS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
_TASK_COLS = (
    "job_name", "task_name", "inst_num", "status", "start_time", "end_time",
    "plan_cpu", "plan_mem", "plan_gpu", "gpu_type",
)  # fmt: skip
_DONE = {"Terminated", "Failed"}


class _Agg:
    """GPU demand and run span of one job's tasks."""

    __slots__ = ("end", "gpus", "start", "types", "unfinished")

    def __init__(self) -> None:
        self.gpus = 0.0
        self.start = math.inf
        self.end = -math.inf
        self.types: set[str] = set()
        self.unfinished = False


def read_alibaba2020(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    job_path, task_path = _paths(Path(path))
    tasks = _read_tasks(task_path, stats)
    fh = open_text(job_path)
    return _jobs(fh, tasks, stats)


def _paths(p: Path) -> tuple[Path, Path]:
    if p.is_dir():
        return p / "pai_job_table.csv", p / "pai_task_table.csv"
    if not p.exists():
        raise UserError(f"trace file not found: {p}")
    task = p.with_name("pai_task_table.csv")
    if not task.exists():
        raise UserError(f"{p}: the PAI task table {task} is missing (it must sit beside it)")
    return p, task


def _rows(fh: IO[str], cols: tuple[str, ...]) -> Iterator[list[str]]:
    for n, row in enumerate(csv.reader(fh)):
        if n == 0 and row[:2] == list(cols[:2]):
            continue  # a header line
        yield row


def _read_tasks(path: Path, stats: SkipStats) -> dict[str, _Agg]:
    out: dict[str, _Agg] = {}
    with open_text(path) as fh:
        for row in _rows(fh, _TASK_COLS):
            if len(row) != len(_TASK_COLS):
                stats.skip("bad task row", ",".join(row))
                continue
            try:
                gpu = float(row[8] or 0) * float(row[2] or 0) / 100.0
                start = float(row[4]) if row[4] else math.nan
                end = float(row[5]) if row[5] else math.nan
            except ValueError:
                stats.skip("bad task row", ",".join(row))
                continue
            if not gpu > 0:
                continue
            agg = out.setdefault(row[0], _Agg())
            agg.gpus += gpu
            if math.isnan(start) or math.isnan(end) or row[3] not in _DONE:
                agg.unfinished = True
            else:
                agg.start, agg.end = min(agg.start, start), max(agg.end, end)
            if row[9]:
                agg.types.add(row[9])
    return out


def _jobs(fh: IO[str], tasks: dict[str, _Agg], stats: SkipStats) -> Iterator[TraceJob]:
    with fh:
        for row in _rows(fh, _JOB_COLS):
            job = _job_of(row, tasks, stats)
            if job is not None:
                yield job


def _job_of(row: list[str], tasks: dict[str, _Agg], stats: SkipStats) -> TraceJob | None:
    example = ",".join(row)
    if len(row) != len(_JOB_COLS) or not row[0]:
        stats.skip("bad row", example)
        return None
    agg = tasks.get(row[0])
    if agg is None:
        stats.skip("zero GPUs", example)
        return None
    if row[3] not in _DONE or agg.unfinished or agg.end < agg.start:
        stats.skip("unfinished", example)
        return None
    try:
        submit = finite(float(row[4]))
    except ValueError:
        stats.skip("bad row", example)
        return None
    if agg.gpus < 1.0:
        gpus, milli = 1, max(1, round(agg.gpus * 1000))
    else:
        gpus, milli = math.ceil(agg.gpus - 1e-9), 1000
    return TraceJob(
        job_id=row[0],
        submit_s=submit,
        duration_s=agg.end - agg.start,
        num_gpus=gpus,
        gpu_milli=milli,
        gpu_types=tuple(sorted(agg.types)),
        user=row[2],
        vc="",
    )
