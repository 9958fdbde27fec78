"""Helpers shared by the commands: bus flags, the event loop."""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from typing import Any, TypeVar

from shared.config import BusSettings

__all__ = ["add_bus_args", "bus_settings", "run_async"]

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
