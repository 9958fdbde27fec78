"""Helpers the trace readers share: opening a file with a clear error, and times."""

from __future__ import annotations

import calendar
import csv
import math
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, TypeVar

from shared.errors import UserError

__all__ = ["finite", "open_text", "parse_time"]


def open_text(path: str | Path) -> IO[str]:
    """Open a trace file for reading as UTF-8 text, or raise a one-line UserError."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"trace {p} is a directory, not a file")
    if not p.exists():
        raise UserError(f"trace file not found: {p}")
    try:
        # utf-8-sig: a byte-order mark (as Windows editors write) is not part of row 1
        return p.open(newline="", encoding="utf-8-sig", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read trace {p}: {exc.strerror or exc}") from exc


def parse_time(text: str) -> float:
    """Seconds from a number, or from `YYYY-MM-DD HH:MM:SS` read as UTC. ValueError if neither."""
    s = text.strip()
    if not s:
        raise ValueError("empty time")
    try:
        return finite(float(s))
    except ValueError:
        pass
    dt = datetime.fromisoformat(s)
    return calendar.timegm(dt.utctimetuple()) + dt.microsecond / 1e6


def finite(x: float) -> float:
    """`x` if it is a finite number, else ValueError (NaN and inf are bad rows)."""
    if not math.isfinite(x):
        raise ValueError(f"not a finite number: {x}")
    return x


_J = TypeVar("_J")


def csv_jobs(
    path: str | Path,
    required: tuple[str, ...],
    what: str,
    job_of: Callable[[dict[str, str]], _J | None],
) -> Iterator[_J]:
    """A CSV trace's rows as jobs, streamed: the header is checked for `required` columns
    at once (a UserError saying the file is not `what`, naming the missing ones),
    then each row goes through `job_of` (None: skipped, counted by `job_of`) and the
    file is closed when the rows run out."""
    fh = open_text(path)
    rows = csv.DictReader(fh)
    missing = [c for c in required if c not in (rows.fieldnames or [])]
    if missing:
        fh.close()
        raise UserError(f"{path}: not {what} (missing columns {missing})")
    return _jobs(fh, rows, job_of)


def _jobs(
    fh: IO[str], rows: csv.DictReader[str], job_of: Callable[[dict[str, str]], _J | None]
) -> Iterator[_J]:
    with fh:
        for row in rows:
            job = job_of(row)
            if job is not None:
                yield job
