"""Standard Workload Format reader (`--format swf`): the Parallel Workloads Archive's
logs (`../shared/traces/swf/`), plain or gzipped (told apart by the gzip magic bytes).

`;` lines are the header (`; MaxNodes: 100`, `; MaxProcs: 100`, `; UnixStartTime: ...`);
every other non-blank line holds 18 whitespace-separated fields, -1 meaning unknown:

    1 job number   2 submit (s)   3 wait   4 run time   5 allocated procs   6 avg CPU
    7 memory   8 requested procs   9 requested time   10 requested memory   11 status
    12 user   13 group   14 executable   15 queue   16 partition   17 preceding job
    18 think time

A processor is one GPU slot (DESIGN.md): a job asks for its requested processors
(field 8), else its allocated ones (5). Its duration is the run time (4); its
`time_limit_s` the requested time (9, None when unknown); `user`, `project` and `app`
are fields 12, 13 and 14 (as given, "" when unknown); its VC is the queue (15, "" when
unknown). Submit times are the log's seconds plus the header's `UnixStartTime` (when
given), so `--since` takes dates. Job ids are the job numbers.

Skipped and counted: a job cancelled before it ran (status 5 with no run time,
"cancelled, never ran"), no run time ("no run time"), no processor count ("no
processors"), a line that does not have 18 numbers ("bad row").
"""

from __future__ import annotations

import gzip
import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from shared.cluster import ClusterSpec, parse_cluster
from shared.errors import UserError
from shared.traces import SkipStats, TraceJob
from shared.traces._io import open_text

__all__ = ["SLOT_TYPE", "read_swf", "swf_cluster", "swf_header"]

SLOT_TYPE = "slot"  # the GPU type name of a cluster built from an SWF header
_FIELDS = 18
_CANCELLED = 5


def _open(path: str | Path) -> IO[str]:
    """The file as text, through gzip when it starts with gzip's magic bytes."""
    p = Path(path)
    fh = open_text(p)
    try:
        with p.open("rb") as raw:
            magic = raw.read(2)
    except OSError as exc:
        fh.close()
        raise UserError(f"cannot read trace {p}: {exc.strerror or exc}") from exc
    if magic != b"\x1f\x8b":
        return fh
    fh.close()
    return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", errors="replace", newline="")


def swf_header(path: str | Path) -> dict[str, str]:
    """The `; Key: value` lines before the first job, as a dict (first value per key)."""
    out: dict[str, str] = {}
    with _open(path) as fh:
        try:
            for line in fh:
                s = line.strip()
                if not s:
                    continue
                if not s.startswith(";"):
                    break
                key, sep, value = s[1:].partition(":")
                if sep and key.strip() and key.strip() not in out:
                    out[key.strip()] = value.strip()
        except (OSError, EOFError) as exc:
            raise UserError(f"cannot read trace {path}: {exc}") from exc
    return out


def swf_cluster(path: str | Path) -> ClusterSpec:
    """The cluster the header describes: `MaxNodes` nodes of `MaxProcs / MaxNodes`
    slots each (`MaxProcs` one-slot nodes without `MaxNodes`); UserError if neither."""
    head = swf_header(path)
    try:
        nodes = int(head["MaxNodes"]) if "MaxNodes" in head else None
        procs = int(head["MaxProcs"]) if "MaxProcs" in head else None
    except ValueError:
        raise UserError(f"{path}: MaxNodes / MaxProcs in the SWF header are not numbers") from None
    if procs is None and nodes is None:
        raise UserError(f"{path}: the SWF header names no MaxNodes or MaxProcs; give --cluster")
    if nodes is None or nodes <= 0:
        nodes, per = procs or 0, 1
    else:
        per = max((procs or nodes) // nodes, 1)
    if nodes <= 0:
        raise UserError(f"{path}: the SWF header gives no processors (MaxProcs {procs})")
    name = Path(path).name.split(".")[0]
    spec = {"name": name, "nodes": [{"name": "n", "count": nodes, "gpu_type": SLOT_TYPE,
                                     "gpus": per}]}  # fmt: skip
    return parse_cluster(spec, f"{path} (SWF header)")


def read_swf(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    fh = _open(path)
    start = 0.0
    head = swf_header(path)
    try:
        start = float(head.get("UnixStartTime", "0"))
    except ValueError:
        start = 0.0
    return _jobs(fh, start if math.isfinite(start) else 0.0, stats)


def _jobs(fh: IO[str], start: float, stats: SkipStats) -> Iterator[TraceJob]:
    with fh:
        for line in fh:
            s = line.strip()
            if not s or s.startswith(";"):
                continue
            job = _job_of(s, start, stats)
            if job is not None:
                yield job


def _job_of(line: str, start: float, stats: SkipStats) -> TraceJob | None:
    parts = line.split()
    if len(parts) < _FIELDS:
        stats.skip("bad row", line)
        return None
    try:
        f = [float(x) for x in parts[:_FIELDS]]
    except ValueError:
        stats.skip("bad row", line)
        return None
    if not all(math.isfinite(x) for x in f) or f[1] < 0:
        stats.skip("bad row", line)
        return None
    run, status = f[3], int(f[10])
    if status == _CANCELLED and run <= 0:
        stats.skip("cancelled, never ran", line)
        return None
    if run < 0:
        stats.skip("no run time", line)
        return None
    procs = int(f[7]) if f[7] > 0 else int(f[4])
    if procs <= 0:
        stats.skip("no processors", line)
        return None
    return TraceJob(
        job_id=parts[0],
        submit_s=start + f[1],
        duration_s=run,
        num_gpus=procs,
        user=_ident(f[11]),
        vc=_ident(f[14]),
        project=_ident(f[12]),
        app=_ident(f[13]),
        time_limit_s=f[8] if f[8] > 0 else None,
    )


def _ident(x: float) -> str:
    """An SWF id field as text; "" for unknown (-1)."""
    return str(int(x)) if x >= 0 else ""
