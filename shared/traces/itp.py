"""Microsoft ITP reader (`--format itp`): the GPU cluster traces published with
ElasticFlow (ASPLOS'23), `../shared/traces/itp/clusterNN.csv`:

    job_id,submission_time,duration,num_gpu

`submission_time` and `duration` are seconds (from the trace's start), `num_gpu` the
GPUs the job asked for. No user, no VC, no GPU type, no requested time: jobs may run
on any type, and a policy has only a job's size and submit time to tell jobs apart.

Skipped and counted: CPU-only jobs ("zero GPUs"), rows that do not parse or with a
negative duration ("bad row").
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from shared.errors import UserError
from shared.traces import SkipStats, TraceJob
from shared.traces._io import open_text

__all__ = ["read_itp"]

_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")


def read_itp(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    fh = open_text(path)
    rows = csv.reader(fh)
    header = next(rows, None)
    if header is None or not set(_COLUMNS) <= {h.strip() for h in header}:
        fh.close()
        raise UserError(f"{path}: not an ITP trace (needs columns {', '.join(_COLUMNS)})")
    return _jobs(fh, rows, [h.strip() for h in header], stats)


def _jobs(
    fh: IO[str], rows: Iterator[list[str]], header: list[str], stats: SkipStats
) -> Iterator[TraceJob]:
    i_id, i_sub, i_dur, i_n = (header.index(c) for c in _COLUMNS)
    width = len(header)
    with fh:
        for row in rows:
            if not row:
                continue  # a blank line
            example = ",".join(row)
            if len(row) != width:
                stats.skip("bad row", example)
                continue
            try:
                submit = float(row[i_sub])
                duration = float(row[i_dur])
                gpus = float(row[i_n])
            except ValueError:
                stats.skip("bad row", example)
                continue
            job_id = row[i_id].strip()
            if (
                not job_id
                or not all(math.isfinite(x) for x in (submit, duration, gpus))
                or gpus != int(gpus)
                or submit < 0
                or duration < 0
                or gpus < 0
            ):
                stats.skip("bad row", example)
                continue
            if gpus == 0:
                stats.skip("zero GPUs", example)
                continue
            yield TraceJob(job_id, submit, duration, int(gpus))
