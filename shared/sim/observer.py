"""What the simulator tells of the jobs it runs, as it happens.

An observer is handed to `Simulator.observers`; the simulator calls it after each
change (before one, for `preempting`), with the state already updated. The bus
executor (services/cluster_sim/rounds.py) publishes these as `JobEvent`s and offload
figures; the simulator itself never needs one. Every method does nothing here: an
observer overrides what it reports.
"""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

from shared.sim.run import Run
from shared.sim.state import Claim

if TYPE_CHECKING:
    from shared.sched.replacement import Move

__all__ = ["SimObserver"]


class SimObserver:
    def started(self, run: Run, now: float) -> None:
        """`run` started from the queue on `run.claim` (not a move: see `moved`)."""

    def rerated(self, seqs: Set[int], now: float) -> None:
        """The offloading jobs `seqs` (running) have a new slowdown from now."""

    def moved(self, run: Run, move: Move, now: float, done: bool) -> None:
        """Re-placement moved `run` to `move.alloc` (`done`), or could not (its GPUs
        were not free: it runs on where it was)."""

    def preempting(self, run: Run, now: float) -> None:
        """`run` is about to be stopped and put back in the queue."""

    def preempted(self, run: Run, claim: Claim, now: float) -> None:
        """`run` was stopped and put back in the queue; `claim`: the GPUs it held."""

    def finished(self, run: Run, claim: Claim, now: float) -> None:
        """`run` finished; `claim`: the GPUs it held."""
