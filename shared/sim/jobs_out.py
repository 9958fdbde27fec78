"""The `--jobs-out` CSV (DESIGN.md): one row per run segment of a job, jobs in
submit order, empty start/finish for jobs that never ran. Times are written
with `repr` (the shortest text that reads back as the same float), so the file
is byte-identical for identical runs and the metrics recomputed from it match
the summary exactly. When a reclaim stopped a job and it lost work (shared/sim/
reclaim.py), a last column `lost_s` gives each segment's lost seconds (the
summary's `restart_lost_gpu_h` is the sum of num_gpus x lost_s / 3600); files of
runs without such a stop have no such column. Likewise a column `timed_out`, 1 on the
last segment of a job stopped at its time limit (`JobSpec.time_limit_s`), only in
files of runs where one was.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Iterable
from pathlib import Path

from shared.errors import UserError
from shared.metrics import JobRecord, Segment

__all__ = ["HEADER", "read_jobs_csv", "write_jobs_csv"]

HEADER = (
    "job_id",
    "vc",
    "submit_s",
    "start_s",
    "finish_s",
    "num_gpus",
    "gpu_milli",
    "gpu_type",
    "nodes",
    "param_bytes",  # offloading jobs: model size (empty: no offload)
    "offload_s",  # run time of the segment added by migrations compute did not hide
    "restart_s",  # its first seconds spent restoring the checkpoint of a re-placed job
)


def write_jobs_csv(records: Iterable[JobRecord], path: str | Path) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    records = list(records)
    lost = any(s.lost_s for r in records for s in r.segments)
    timed = any(r.timed_out for r in records)
    w.writerow((*HEADER, *(("lost_s",) if lost else ()), *(("timed_out",) if timed else ())))
    tail: tuple[str, ...] = ("",) * (lost + timed)
    for r in records:
        sub = repr(r.submit_s)
        pb = r.param_bytes or ""
        if not r.segments:
            w.writerow(
                (r.job_id, r.vc, sub, "", "", r.num_gpus, r.gpu_milli, "", "", pb, "", "", *tail)
            )
        last = len(r.segments) - 1
        for k, s in enumerate(r.segments):
            off = repr(s.offload_s) if r.param_bytes else ""
            rst = repr(s.restart_s) if r.param_bytes else ""
            los = (repr(s.lost_s),) if lost else ()
            out = ("1" if r.timed_out and k == last else "",) if timed else ()
            w.writerow(
                (r.job_id, r.vc, sub, repr(s.start_s), repr(s.finish_s), r.num_gpus, r.gpu_milli,
                 s.gpu_type, s.nodes, pb, off, rst, *los, *out)
            )  # fmt: skip
    if str(path) == "-":  # stdout, as `--json -` is
        sys.stdout.write(buf.getvalue())
        return
    try:
        Path(path).write_text(buf.getvalue())
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from exc


def read_jobs_csv(path: str | Path) -> list[JobRecord]:
    """Records back from a `--jobs-out` file (segments of a job joined, in file order)."""
    out: dict[str, JobRecord] = {}
    with Path(path).open(newline="") as fh:
        for row in csv.DictReader(fh):
            rec = out.get(row["job_id"])
            if rec is None:
                rec = JobRecord(
                    row["job_id"], row["vc"], float(row["submit_s"]), int(row["num_gpus"]),
                    int(row["gpu_milli"] or 1000), (), int(row.get("param_bytes") or 0),
                )  # fmt: skip
            if row["start_s"]:
                seg = Segment(
                    float(row["start_s"]), float(row["finish_s"]), row["gpu_type"], row["nodes"],
                    float(row.get("offload_s") or 0.0), float(row.get("restart_s") or 0.0),
                    float(row.get("lost_s") or 0.0),
                )  # fmt: skip
                rec = JobRecord(rec.job_id, rec.vc, rec.submit_s, rec.num_gpus, rec.gpu_milli,
                                (*rec.segments, seg), rec.param_bytes,
                                rec.timed_out or row.get("timed_out") == "1")  # fmt: skip
            out[rec.job_id] = rec
    return list(out.values())
