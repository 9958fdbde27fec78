"""Helpers the trace readers share: opening a file with a clear error, and times."""

from __future__ import annotations

import calendar
import math
from datetime import datetime
from pathlib import Path
from typing import IO

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
