"""ALCF job-log reader (`--format alcf`): ThetaGPU's log as DIR-LAB/lumos publishes it
(`../shared/traces/alcf/thetagpu-2023-jan-apr.csv`):

    ,job,user,project,state,gpu_num,cpu_num,node_num,submit_time,wait_time,run_time,
    wall_time,node_hour,new_status

`node_num` counts whole DGX A100 nodes of 8 GPUs (`gpu_num` repeats it: it counts
nodes too), so a job asks for 8 x `node_num` GPUs of type A100. `run_time` is the
actual run time (s), `wall_time` the user's requested wall time (s, `time_limit_s`),
`submit_time` Unix seconds. `user` and `project` are anonymised ids; `0.0` means not
given (""). `job` is the job id. The log names no executable (`app` stays "").

Skipped and counted: no nodes ("zero GPUs"), no or negative run time ("no run
time"), rows that do not parse ("bad row").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from shared.traces import SkipStats, TraceJob
from shared.traces._io import csv_jobs

__all__ = ["GPUS_PER_NODE", "GPU_TYPE", "read_alcf"]

GPUS_PER_NODE = 8  # a DGX A100
GPU_TYPE = "A100"
_REQUIRED = ("job", "node_num", "submit_time", "run_time", "wall_time")


def read_alcf(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    return csv_jobs(path, _REQUIRED, "an ALCF job log", lambda row: _job_of(row, stats))


def _number(text: str | None) -> float:
    x = float(text or "")
    if not math.isfinite(x):
        raise ValueError(text)
    return x


def _job_of(row: dict[str, str], stats: SkipStats) -> TraceJob | None:
    example = ",".join(str(v) for v in row.values())
    if None in row or any(v is None for v in row.values()):
        stats.skip("bad row", example)
        return None
    try:
        nodes = _number(row["node_num"])
        submit = _number(row["submit_time"])
        run = _number(row["run_time"])
        wall = _number(row["wall_time"]) if (row["wall_time"] or "").strip() else 0.0
    except ValueError:
        stats.skip("bad row", example)
        return None
    job_id = (row["job"] or "").strip()
    if not job_id or nodes != int(nodes) or submit < 0:
        stats.skip("bad row", example)
        return None
    if nodes <= 0:
        stats.skip("zero GPUs", example)
        return None
    if run < 0:
        stats.skip("no run time", example)
        return None
    return TraceJob(
        job_id=job_id,
        submit_s=submit,
        duration_s=run,
        num_gpus=int(nodes) * GPUS_PER_NODE,
        gpu_types=(GPU_TYPE,),
        user=_ident(row.get("user")),
        project=_ident(row.get("project")),
        time_limit_s=wall if wall > 0 else None,
    )


def _ident(text: str | None) -> str:
    """An anonymised id; "" for not given (`0.0`, `0`, empty)."""
    s = (text or "").strip()
    try:
        return "" if float(s) == 0 else s
    except ValueError:
        return s
