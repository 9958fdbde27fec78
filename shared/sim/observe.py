"""What the simulator shows a policy each round (shared.policy_api.Observation),
and the index of waiting demand it keeps for that and for its fit test.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from shared.placement_api import FULL_GPU
from shared.policy_api import History, QueuedJob
from shared.sim.state import ClusterState

if TYPE_CHECKING:
    from shared.fairshare import FairShare
    from shared.sim.offload_state import OffloadState

__all__ = ["SimObservation", "WaitingIndex"]


class WaitingIndex:
    """Waiting jobs by class (allowed types, sharing or not): how many of each demand.

    `any_fits` answers "could any waiting job start alone?" in O(classes), which is
    what lets the simulator skip rounds that cannot start anything.
    """

    def __init__(self) -> None:
        self._classes: dict[tuple[frozenset[str], bool], Counter[int]] = {}
        self.gpus_by_types: dict[frozenset[str], float] = {}
        self.count = 0

    def add(self, job: QueuedJob) -> None:
        share = job.gpu_milli < FULL_GPU and job.num_gpus == 1
        c = self._classes.setdefault((job.gpu_types, share), Counter())
        c[job.gpu_milli if share else job.num_gpus] += 1
        g = self.gpus_by_types
        g[job.gpu_types] = g.get(job.gpu_types, 0.0) + job.gpus
        self.count += 1

    def remove(self, job: QueuedJob) -> None:
        share = job.gpu_milli < FULL_GPU and job.num_gpus == 1
        c = self._classes[(job.gpu_types, share)]
        key = job.gpu_milli if share else job.num_gpus
        c[key] -= 1
        if not c[key]:
            del c[key]
        self.gpus_by_types[job.gpu_types] -= job.gpus
        self.count -= 1

    def any_fits(self, state: ClusterState) -> bool:
        for (types, share), demand in self._classes.items():
            if not demand:
                continue
            least = min(demand)
            if share:
                if state.fits(1, least, types):
                    return True
            elif least <= state.whole_free(types):
                return True
        return False


class SimObservation:
    """`Observation` over the simulator's live state (reads it; never copies it)."""

    def __init__(
        self,
        state: ClusterState,
        waiting: WaitingIndex,
        history: History,
        vc_held: dict[str, float],
        fair: FairShare | None = None,
    ) -> None:
        self.now = 0.0
        self.history = history
        self._state = state
        self._waiting = waiting
        self._vc_held = vc_held
        self._fair = fair
        self.offload: OffloadState | None = None  # the simulator's, once it has one

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted(self._state.total_by_type))

    def total_gpus(self, gpu_type: str | None = None) -> int:
        if gpu_type is None:
            return self._state.total
        return self._state.total_by_type.get(gpu_type, 0)

    def free_gpus(self, gpu_type: str | None = None) -> int:
        if gpu_type is None:
            return self._state.whole_total
        return self._state.whole_by_type.get(gpu_type, 0)

    def waiting_gpus(self, gpu_type: str | None = None) -> float:
        return sum(
            g
            for types, g in self._waiting.gpus_by_types.items()
            if gpu_type is None or not types or gpu_type in types
        )

    def fragmentation(self, gpu_type: str | None = None) -> float:
        return self._state.fragmentation(gpu_type)

    def vc_gpus(self, vc: str) -> float:
        return self._vc_held.get(vc, 0.0)

    def queue_length(self) -> int:
        return self._waiting.count

    def fair_share(self, vc: str) -> float:
        """The fair-share factor of `vc`'s queue now (shared/fairshare.py): 1 with no
        usage, 0.5 at exactly its share of the decayed usage, less above it."""
        return 1.0 if self._fair is None else self._fair.factor(vc, self.now)

    def offload_pressure(self, job: QueuedJob) -> float:
        """The job's offload demand against the free PCIe bandwidth of its allowed
        types (shared/offload_signal.py); 0 for a job that does not offload."""
        if self.offload is None or self.offload.job(job.job_id) is None:
            return 0.0
        return self.offload.pressure(job.job_id, job.gpu_types)
