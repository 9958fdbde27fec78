"""Placers by name, for `--placer` flags, benchmarks and the placement service."""

from __future__ import annotations

from collections.abc import Callable

from services.placement.baselines import BestFitPlacer, FgdPlacer
from services.placement.greedy import GreedyPlacer
from services.placement.milp import MilpPlacer
from shared.errors import UserError
from shared.placement_api import Placer

__all__ = ["PLACERS", "make_placer"]


def _first_fit() -> Placer:
    placer = GreedyPlacer()
    placer.name = "first-fit"
    return placer


PLACERS: dict[str, Callable[[], Placer]] = {
    "greedy": GreedyPlacer,
    # greedy.py is first-fit in priority order (a share prefers an already-shared GPU)
    "first-fit": _first_fit,
    "best-fit": BestFitPlacer,
    "fgd": FgdPlacer,
    "milp": MilpPlacer,
}


def make_placer(name: str) -> Placer:
    try:
        return PLACERS[name]()
    except KeyError:
        raise UserError(f"unknown placer {name!r}; choose from {', '.join(PLACERS)}") from None
