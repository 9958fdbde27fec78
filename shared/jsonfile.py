"""JSON files the commands, benchmarks and services write: indented, strict (no NaN)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from shared.errors import UserError

__all__ = ["finite_or_null", "write_json"]


def finite_or_null(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with its non-finite float values (NaN, e.g. no job finished, or an empty
    size bucket's average), at any depth, as None, so that they are written as JSON
    null: NaN and Infinity are not JSON, and strict parsers refuse the whole file."""
    out = _finite(data)
    assert isinstance(out, dict)
    return out


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def write_json(data: object, out: str, sort_keys: bool = False) -> None:
    """`data` as indented JSON to the file `out`, or to stdout when `out` is "-";
    non-finite numbers as null (`finite_or_null`), never as NaN."""
    text = json.dumps(_finite(data), indent=2, sort_keys=sort_keys, allow_nan=False) + "\n"
    if out == "-":
        sys.stdout.write(text)
        return
    try:
        Path(out).write_text(text)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from exc
