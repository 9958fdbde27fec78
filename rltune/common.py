"""Helpers shared by the commands and benchmarks: bus flags, the event loop, JSON out."""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from shared.config import BusSettings
from shared.errors import UserError
from shared.jsonfile import finite_or_null, write_json
from shared.recipe import check_round_interval

__all__ = [
    "add_bus_args",
    "bus_settings",
    "finite_or_null",
    "non_negative_int",
    "out_dir",
    "port_number",
    "positive_float",
    "positive_int",
    "run_async",
    "unreachable",
    "write_json",
]

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


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1-65535."""
    return _bounded_int(text, 1, 65535, "a TCP port (1-65535)")


def port_or_off(text: str) -> int:
    """argparse type: a TCP port, or 0 for off."""
    return _bounded_int(text, 0, 65535, "a TCP port (1-65535), or 0 for off")


def positive_int(text: str) -> int:
    return _bounded_int(text, 1, 2**31, "a positive whole number")


def non_negative_int(text: str) -> int:
    return _bounded_int(text, 0, 2**31, "a whole number, 0 or more")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _bounded_int(text: str, lo: int, hi: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def unreachable(settings: BusSettings, exc: BaseException) -> UserError:
    """The one-line error for a broker that cannot be reached."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    return UserError(f"cannot reach a Kafka broker at {settings.bootstrap} ({detail})")


def bus_settings(args: argparse.Namespace) -> BusSettings:
    return BusSettings.resolve(args.bootstrap, args.topic_prefix)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop (the project's event loop)."""
    import uvloop

    return uvloop.run(coro)


def round_interval(seconds: float) -> float:
    """`--round-interval` (simulate, eval, whatif, up), checked: 0 or more."""
    return check_round_interval(seconds)


def out_dir(path: str) -> Path:
    """`--out DIR`, created if needed (one line if it cannot be)."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create --out {out}: {exc.strerror or exc}") from exc
    return out
