"""Placers by name, for `--placer` flags, benchmarks and the placement service."""

from __future__ import annotations

from collections.abc import Callable

from services.placement.baselines import BestFitPlacer, FgdPlacer, FirstFitPlacer
from services.placement.greedy import GreedyPlacer
from shared.errors import UserError
from shared.placement_api import Placer
from shared.sched.replacement import ReplaceConfig

__all__ = ["OFFLOAD_SUFFIX", "PLACERS", "REPLACE_SUFFIX", "make_placer"]

OFFLOAD_SUFFIX = "+offload"
REPLACE_SUFFIX = "+replace"


def _milp() -> Placer:
    # imported when asked for: OR-Tools (and the pandas it loads) is the largest
    # dependency, and the other placers run without it (a GPU host with no OR-Tools)
    from services.placement.milp import MilpPlacer

    return MilpPlacer()


PLACERS: dict[str, Callable[[], Placer]] = {
    "greedy": GreedyPlacer,  # fastest allowed type first, best fit within it
    "first-fit": FirstFitPlacer,  # the first node in input order that holds the job
    "best-fit": BestFitPlacer,
    "fgd": FgdPlacer,
    "milp": _milp,
}


# CP-SAT deterministic time per solve in reproducible mode: Philly windows need ~1e-5
# (p99 3e-5); harder windows are cut here rather than at a wall-clock instant.
REPRODUCIBLE_DETERMINISTIC_TIME = 0.05


def make_placer(
    name: str, reproducible: bool = False, replace: ReplaceConfig | None = None
) -> Placer:
    """A placer by name. `reproducible` (simulation): every answer depends only on the
    inputs, never on the machine's speed or load (the MILP stops on deterministic time).
    `NAME+offload` (milp, greedy): the same placer charged with offloading jobs'
    migration slowdown (offload_term.py); `NAME+offload+replace`: and it moves running
    offloading jobs that have run long to where they stream less (replace.py; settings
    `replace`, default ReplaceConfig())."""
    if name.endswith(OFFLOAD_SUFFIX + REPLACE_SUFFIX):
        from services.placement.offload_term import OffloadAwarePlacer

        base = name.removesuffix(OFFLOAD_SUFFIX + REPLACE_SUFFIX)
        if base in ("milp", "greedy"):
            return OffloadAwarePlacer(make_placer(base, reproducible), replace or ReplaceConfig())
    if name.endswith(OFFLOAD_SUFFIX) and name.removesuffix(OFFLOAD_SUFFIX) in ("milp", "greedy"):
        from services.placement.offload_term import OffloadAwarePlacer

        return OffloadAwarePlacer(make_placer(name.removesuffix(OFFLOAD_SUFFIX), reproducible))
    if name == "milp" and reproducible:
        from services.placement.milp import MilpConfig, MilpPlacer

        return MilpPlacer(MilpConfig(deterministic_time=REPRODUCIBLE_DETERMINISTIC_TIME))
    try:
        return PLACERS[name]()
    except KeyError:
        raise UserError(
            f"unknown placer {name!r}; choose from {', '.join(PLACERS)} (milp and greedy also as "
            f"NAME{OFFLOAD_SUFFIX} and NAME{OFFLOAD_SUFFIX}{REPLACE_SUFFIX})"
        ) from None
