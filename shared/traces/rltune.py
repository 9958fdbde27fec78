"""RLTune artifact CSV reader (`--format rltune`), dshruti20/RLTune `GPU_Traces/`.

19 columns, no header (a lone first-line number, as in `synthetic_trace.csv`,
is ignored), SWF-derived; -1 = not available:

    0 job_id  1 submit_time  2 wait_time  3 run_time  4 num_gpus  5 cpu_time
    6 used_memory  7 request_cpus  8 request_time  9 request_memory  10 status
    11 user_id  12 group_id  13 executable_number  14 queue_number
    15 partition_number  16 preceding_job  17 vc_id  18 gpu_type

`gpu_type` codes: 0 T4, 1 MISC, 2 P100, 3 V100_16GB, 4 V100_32GB; -1 = any.
Skipped and counted: run time -1 ("unfinished"), `num_gpus` <= 0 ("zero GPUs"),
rows of the wrong width or that do not parse ("bad row").
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from shared.traces import SkipStats, TraceJob
from shared.traces._io import finite, open_text

__all__ = ["GPU_CODES", "read_rltune"]

GPU_CODES = {0: "T4", 1: "MISC", 2: "P100", 3: "V100_16GB", 4: "V100_32GB"}
_WIDTH = 19


def read_rltune(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    fh = open_text(path)
    with fh:
        for n, row in enumerate(csv.reader(fh)):
            if n == 0 and len(row) == 1 and row[0].strip().lstrip("-").isdigit():
                continue  # the count line some of the artifact's files start with
            job = _job_of(row, stats)
            if job is not None:
                yield job


def _job_of(row: list[str], stats: SkipStats) -> TraceJob | None:
    example = ",".join(row)
    if len(row) != _WIDTH or not row[0].strip():
        stats.skip("bad row", example)
        return None
    try:
        submit = finite(float(row[1]))
        run = finite(float(row[3]))
        gpus = int(float(row[4]))
        code = int(float(row[18]))
        user, vc = _id(row[11]), _id(row[17])
    except ValueError:
        stats.skip("bad row", example)
        return None
    if run < 0:
        stats.skip("unfinished", example)
        return None
    if gpus <= 0:
        stats.skip("zero GPUs", example)
        return None
    if code != -1 and code not in GPU_CODES:
        stats.skip("bad row", example)
        return None
    types = (GPU_CODES[code],) if code in GPU_CODES else ()
    return TraceJob(row[0].strip(), submit, run, gpus, gpu_types=types, user=user, vc=vc)


def _id(text: str) -> str:
    """An id column as text; -1 (not available) becomes ''."""
    v = text.strip()
    return "" if v in ("-1", "") else v
