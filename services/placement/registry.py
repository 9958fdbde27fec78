"""Placers by name, for `--placer` flags, benchmarks and the placement service."""

from __future__ import annotations

from collections.abc import Callable

from services.placement.greedy import GreedyPlacer
from shared.errors import UserError
from shared.placement_api import Placer

__all__ = ["PLACERS", "make_placer"]

PLACERS: dict[str, Callable[[], Placer]] = {
    "greedy": GreedyPlacer,
}


def make_placer(name: str) -> Placer:
    try:
        return PLACERS[name]()
    except KeyError:
        raise UserError(f"unknown placer {name!r}; choose from {', '.join(PLACERS)}") from None
