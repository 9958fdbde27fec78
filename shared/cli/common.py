"""Helpers shared by the commands and benchmarks: bus flags, the event loop, JSON out."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from shared.config import BusSettings
from shared.errors import UserError

__all__ = ["add_bus_args", "bus_settings", "run_async", "write_json"]

T = TypeVar("T")


def add_bus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=None,
        help="Kafka bootstrap servers (default: $RLTUNE_BOOTSTRAP_SERVERS or localhost:9092)",
    )
    p.add_argument(
        "--topic-prefix",
        default=None,
        help="topic name prefix (default: $RLTUNE_TOPIC_PREFIX or 'rltune.')",
    )


def bus_settings(args: argparse.Namespace) -> BusSettings:
    return BusSettings.resolve(args.bootstrap, args.topic_prefix)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop (the project's event loop)."""
    import uvloop

    return uvloop.run(coro)


def write_json(data: object, out: str, sort_keys: bool = False) -> None:
    """`data` as indented JSON to the file `out`, or to stdout when `out` is "-"."""
    text = json.dumps(data, indent=2, sort_keys=sort_keys) + "\n"
    if out == "-":
        sys.stdout.write(text)
        return
    try:
        Path(out).write_text(text)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from exc
