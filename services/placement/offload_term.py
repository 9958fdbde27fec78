"""Placement that knows offloading: the slowdown an offloading job would suffer, and
cause to the offloading jobs already there, charged on each node class.

`OffloadAwarePlacer` wraps the MILP or the greedy placer. It reads an
`OffloadView` (in simulation, the simulator's shared.sim.offload_state.OffloadState):
which window jobs offload, how many offloading GPUs stream on each node, and the
cost model's estimate for a job on a node. Windows without an offloading job go to
the wrapped placer unchanged.

MILP. The node classes gain a bandwidth dimension: a node of type t with b
offloading GPUs streaming on it (b capped at 8) becomes type "t~b", same
speed; jobs allowed t may use every t~b. For an offloading job j on t~b the
objective is charged

    C_j,t~b = round(value_scale · g_j · w_j · speed_t · 0.45 · x / (1 + x)),  x = (1 − 1/f_j) + Δ_j

f_j the job's own slowdown on the class's representative node (its first) with
its GPUs added, Δ_j the slowdown it adds to the offloading GPUs already there (Σ
over them of f_after − f_before, per GPU of j). The charge joins T_j,t (the
Scorer's per-job, per-type cost), so it is in the model, the warm start, the
one-job enumeration and the greedy comparison alike; below 0.45 of the job's
value (with T ≤ 0.5) a charged job is still worth starting, so the order rule and
the set of jobs that start are untouched (ordered.py chooses them). Jobs in one
window are not charged for each other.

Greedy. The same estimate per node: an offloading job goes to the nodes of the
cheapest estimate (rounded to 0.01) where it fits, then the next, and so on
(greedy.py's rule within each); others are placed as greedy.py places them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Protocol

from services.placement.greedy import greedy_allocations
from services.placement.milp import MilpPlacer
from services.placement.state import apply_allocations
from shared.placement_api import Allocation, JobRequest, NodeFree, PlacementResult, Placer

__all__ = ["CAP", "OffloadAwarePlacer", "OffloadView", "offload_cost"]

BUCKETS = 8  # offloading GPUs on a node: 0, 1, .., 8+
CAP = 0.45  # the charge stays below this share of the job's value


class OffloadView(Protocol):
    def job(self, job_id: str) -> tuple[int, int] | None:
        """(param bytes, GPUs) of an offloading job; None if it does not offload."""
        ...

    def streams_on(self, node_id: str) -> int: ...

    def estimate(
        self, param_bytes: int, gpus: int, node_id: str, take: int, extra: int = 0
    ) -> tuple[float, float]: ...


def offload_cost(view: OffloadView, job: JobRequest, node_id: str, extra: int = 0) -> float:
    """(1 − 1/f) + Δ of the job on the node (0 for a job that does not offload)."""
    spec = view.job(job.job_id)
    if spec is None:
        return 0.0
    own, caused = view.estimate(spec[0], spec[1], node_id, job.num_gpus, extra)
    return (1.0 - 1.0 / own) + caused


class OffloadAwarePlacer:
    def __init__(self, inner: Placer) -> None:
        self.inner = inner
        self.name = f"{inner.name}+offload"
        self.leaves_cycles = bool(getattr(inner, "leaves_cycles", False))
        self.offload_view: OffloadView | None = None  # set by the simulator

    def place(
        self, jobs: Sequence[JobRequest], nodes: Sequence[NodeFree], speed: Mapping[str, float]
    ) -> PlacementResult:
        view = self.offload_view
        if view is None or not any(view.job(j.job_id) for j in jobs):
            return self.inner.place(jobs, nodes, speed)
        if isinstance(self.inner, MilpPlacer):
            res = self._milp(self.inner, view, jobs, nodes, speed)
            if res.status != "FALLBACK_GREEDY":
                return res
        return PlacementResult(tuple(self._greedy(view, jobs, nodes)), status="GREEDY")

    # ---- MILP: node classes by bandwidth use, the charge in the objective --------------
    def _milp(
        self,
        milp: MilpPlacer,
        view: OffloadView,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
    ) -> PlacementResult:
        rep: dict[str, str] = {}  # virtual type -> its representative (first) node
        vnodes = []
        for n in nodes:
            vt = f"{n.gpu_type}~{min(view.streams_on(n.node_id), BUCKETS)}"
            rep.setdefault(vt, n.node_id)
            vnodes.append(NodeFree(n.node_id, vt, n.free_milli))
        base = {vt: vt.rsplit("~", 1)[0] for vt in rep}
        vjobs = [_virtual(j, base) for j in jobs]
        vspeed = {vt: speed.get(t, 1.0) for vt, t in base.items()}
        scale = milp.config.weights.value_scale
        cache: dict[tuple[str, str], int] = {}

        def charge(job: JobRequest, vt: str) -> int:
            key = (job.job_id, vt)
            if key not in cache:
                cost = offload_cost(view, job, rep[vt]) if vt in rep else 0.0
                g = job.num_gpus * job.gpu_milli / 1000
                share = CAP * cost / (1.0 + cost)
                cache[key] = round(scale * g * job.weight * vspeed.get(vt, 1.0) * share)
            return cache[key]

        return milp.place_charged(vjobs, vnodes, vspeed, charge)

    # ---- greedy: cheapest estimate first ----------------------------------------------
    def _greedy(
        self, view: OffloadView, jobs: Sequence[JobRequest], nodes: Sequence[NodeFree]
    ) -> list[Allocation]:
        free = list(nodes)
        added: dict[str, int] = {}  # offloading GPUs this window put on each node
        out: list[Allocation] = []
        for job in jobs:
            if view.job(job.job_id) is None:
                got = greedy_allocations([job], free)
            else:
                cost = partial(_cost_on, view, job, added)
                got = _cheapest_first(job, free, cost)
                for node_id, idx in got[0].gpus if got else ():
                    added[node_id] = added.get(node_id, 0) + len(idx)
            if got:
                out += got
                free = apply_allocations(free, got)
        return out


def _virtual(j: JobRequest, base: Mapping[str, str]) -> JobRequest:
    """The job allowed every virtual type of its allowed types (any stays any)."""
    types = (
        frozenset(vt for vt, t in base.items() if t in j.gpu_types) if j.gpu_types else j.gpu_types
    )
    return JobRequest(j.job_id, j.num_gpus, j.gpu_milli, types, j.weight, j.score, j.est_run_s)


def _cost_on(view: OffloadView, job: JobRequest, added: Mapping[str, int], node_id: str) -> float:
    return offload_cost(view, job, node_id, added.get(node_id, 0))


def _cheapest_first(
    job: JobRequest, nodes: Sequence[NodeFree], cost: Callable[[str], float]
) -> list[Allocation]:
    tiers: dict[float, list[NodeFree]] = {}
    for n in nodes:
        if job.allows(n.gpu_type) and n.free_milli and max(n.free_milli) >= job.gpu_milli:
            tiers.setdefault(round(cost(n.node_id), 2), []).append(n)
    for c in sorted(tiers):
        got = greedy_allocations([job], tiers[c])
        if got:
            return got
    return greedy_allocations([job], nodes)  # spread over tiers (a multi-node job)
