"""Philly readers (`--format philly`): the per-job CSV, and the raw `cluster_job_log`.

CSV (`../shared/traces/philly/philly-sep-oct.csv`, from the Pollux artifact):

    timestamp,duration,num_gpus,gpu_time,cluster

`timestamp` is the submit time (`YYYY-MM-DD HH:MM:SS`, read as UTC), `duration`
the run time in seconds, `cluster` the virtual cluster (VC). Rows have no id;
a job is named `philly-<data line number>` (1-based, after the header).

Raw JSON (msr-fiddle/philly-traces `cluster_job_log`): one JSON array of jobs

    {"status": "Pass", "vc": "...", "jobid": "application_...", "user": "...",
     "submitted_time": "2017-10-07 13:07:53",
     "attempts": [{"start_time": "...", "end_time": "...",
                   "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}]}]}

streamed object by object (the public file is 0.98 GB). The job's GPUs are those
of its first attempt; its duration is the sum of its attempts' run times (what
it held GPUs for). Skipped: status `Running`/`Queued` or an attempt with no end
("unfinished"), no attempt ("never ran"), no GPU ("zero GPUs"), anything that
does not parse ("bad row").
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from shared.errors import UserError
from shared.traces import SkipStats, TraceJob
from shared.traces._io import finite, open_text, parse_time

__all__ = ["iter_json_array", "read_philly", "read_philly_csv", "read_philly_json"]

_CSV_COLUMNS = ("timestamp", "duration", "num_gpus")
_CHUNK = 1 << 20


def read_philly(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    """The CSV or the raw JSON, told apart by the first non-blank character."""
    fh = open_text(path)
    with fh:
        head = fh.read(4096).lstrip()
    if head.startswith(("[", "{")):
        return read_philly_json(path, stats)
    return read_philly_csv(path, stats)


def read_philly_csv(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    fh = open_text(path)
    rows = csv.reader(fh)
    header = next(rows, None)
    if header is None or not set(_CSV_COLUMNS) <= set(header):
        fh.close()
        raise UserError(f"{path}: not a Philly CSV (needs columns {', '.join(_CSV_COLUMNS)})")
    return _csv_jobs(fh, rows, header, stats)


def _csv_jobs(
    fh: IO[str], rows: Iterator[list[str]], header: list[str], stats: SkipStats
) -> Iterator[TraceJob]:
    i_ts, i_dur, i_n = (header.index(c) for c in _CSV_COLUMNS)
    i_vc = header.index("cluster") if "cluster" in header else None
    width = len(header)
    with fh:
        for n, row in enumerate(rows, start=1):
            if not row:
                continue  # a blank line
            if len(row) != width:
                stats.skip("bad row", ",".join(row))
                continue
            try:
                submit = parse_time(row[i_ts])
                duration = finite(float(row[i_dur]))
                gpus = int(row[i_n])
            except ValueError:
                stats.skip("bad row", ",".join(row))
                continue
            if gpus == 0:
                stats.skip("zero GPUs", ",".join(row))
                continue
            if gpus < 0 or duration < 0:
                stats.skip("bad row", ",".join(row))
                continue
            vc = row[i_vc] if i_vc is not None else ""
            yield TraceJob(f"philly-{n}", submit, duration, gpus, vc=vc)


def read_philly_json(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    fh = open_text(path)
    with fh:
        for obj in iter_json_array(fh, stats):
            job = _json_job(obj, stats)
            if job is not None:
                yield job


def _json_job(obj: Any, stats: SkipStats) -> TraceJob | None:
    example = json.dumps(obj)[:200] if not isinstance(obj, str) else obj[:200]
    if not isinstance(obj, dict):
        stats.skip("bad row", example)
        return None
    status = str(obj.get("status", ""))
    attempts = obj.get("attempts")
    if status in ("Running", "Queued", "Waiting"):
        stats.skip("unfinished", example)
        return None
    if not isinstance(attempts, list) or not attempts:
        stats.skip("never ran", example)
        return None
    try:
        submit = parse_time(str(obj["submitted_time"]))
        gpus = sum(len(d.get("gpus") or ()) for d in attempts[0].get("detail") or ())
        duration = 0.0
        for a in attempts:
            if a.get("end_time") in (None, "None", "") or a.get("start_time") in (None, "None"):
                stats.skip("unfinished", example)
                return None
            duration += max(0.0, parse_time(str(a["end_time"])) - parse_time(str(a["start_time"])))
        job_id = str(obj["jobid"])
    except (KeyError, TypeError, ValueError, AttributeError):
        stats.skip("bad row", example)
        return None
    if gpus == 0:
        stats.skip("zero GPUs", example)
        return None
    user, vc = str(obj.get("user") or ""), str(obj.get("vc") or "")
    return TraceJob(job_id, submit, duration, gpus, user=user, vc=vc)


def iter_json_array(fh: IO[str], stats: SkipStats) -> Iterator[Any]:
    """Stream the elements of a top-level JSON array (or of JSON lines) one at a time.

    Only one element (and one read chunk) is held in memory at a time. A truncated
    or malformed tail is counted as one "bad row" and ends the stream.
    """
    dec = json.JSONDecoder()
    buf, pos, eof, opened = "", 0, False, False
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if pos < len(buf) and not opened:
            opened = True
            pos += buf[pos] == "["
            continue
        if pos < len(buf) and buf[pos] == "]":
            return
        need_more = pos >= len(buf)
        if not need_more:
            try:
                obj, end = dec.raw_decode(buf, pos)
                need_more = end >= len(buf) and not eof  # a number may be cut at the chunk end
            except json.JSONDecodeError:
                if eof:
                    stats.skip("bad row", buf[pos : pos + 200])
                    return
                need_more = True
            if not need_more:
                yield obj
                pos = end
                continue
        if eof:
            return
        chunk = fh.read(_CHUNK)
        eof = not chunk
        buf, pos = buf[pos:] + chunk, 0
