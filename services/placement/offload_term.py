"""Placement that knows offloading: the slowdown an offloading job would suffer, and
cause to the offloading jobs already there, charged on each node class.

`OffloadAwarePlacer` wraps the MILP or the greedy placer. It reads an
`OffloadView` (in simulation, the simulator's shared.sim.offload_state.OffloadState):
which window jobs offload, how many offloading GPUs stream on each node, and the
cost model's estimate for a job on a node. Windows without an offloading job go to
the wrapped placer unchanged.

MILP. The node classes gain a bandwidth dimension: a node of type t with b
offloading GPUs streaming on it (b capped at 8) becomes type "t~b~d", same
speed, d the class of the slowdown Δ the window's first offloading job would add
to the offloading GPUs there (edges DELTA_STEPS; nodes with equal b can hold
jobs that suffer very differently); jobs allowed t may use every t~b~d. For an
offloading job j on class c = t~b~d the objective is charged

    raw_j,c = round(value_scale · g_j · w_j · speed_t · WEIGHT · min(x, 1))
    x       = (1 − 1/f_j) + Δ_j
    C_j,c   = raw_j,c − max_{c' allowed} raw_j,c'

f_j the job's own slowdown on the class's representative node (its first) with
its GPUs added, Δ_j the slowdown it adds to the offloading GPUs already there (Σ
over them of f_after − f_before, per GPU of j): x is the share of a GPU's
throughput the placement loses. C joins T_j,t (the Scorer's per-job, per-type
cost), so it is in the model, the warm start, the one-job enumeration and the
greedy comparison alike. Measured from the job's dearest class, C is a bonus (≤ 0)
that never makes a job less worth starting than without the term (ordered.py
chooses which jobs start, and the MILP's answer must start exactly those); only
where it starts changes. WEIGHT = 16 job
values per lost GPU makes the offload estimate outweigh the fragmentation
differences between places (chosen on the README's tuning slice: offload slowdown
0.421, 0.380, 0.370, 0.369, 0.376 at WEIGHT 2, 4, 8, 16, 32, against 1.063
without the term; the earlier shape, 0.45 · x / (1 + x) from the cheapest class,
left 0.492).

Jobs of one window placed on one node share its bandwidth too. The whole-GPU
slots of offloading single-node jobs are their own slot kind (classes.STREAM),
so each node pattern says how many offloading GPUs o it starts there, and the
pattern is charged what they cost each other (objective.py's S_n):

    S_c(pattern) = Σ_{streaming slots s of k GPUs} (C̄_{k,c}(o − k) − C̄_{k,c}(0))

C̄_{k,c}(e) the mean over the window's offloading k-GPU jobs allowed t of their
raw charge raw_j,c computed with e more offloading GPUs on the node (one slot alone
costs nothing more; two or more pay for each other). Multi-node jobs' parts stay
plain slots (not charged for each other).

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

__all__ = ["WEIGHT", "OffloadAwarePlacer", "OffloadView", "SameRound", "offload_cost"]

BUCKETS = 8  # offloading GPUs on a node: 0, 1, .., 8+
WEIGHT = 16.0  # charge per GPU of throughput lost, in job values per GPU (module doc)
DELTA_STEPS = (0.05, 0.15, 0.3, 0.6, 1.2)  # edges of Δ classes of nodes with streams


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
        greedy: list[Allocation] | None = None
        if isinstance(self.inner, MilpPlacer):
            res = self._milp(self.inner, view, jobs, nodes, speed)
            if res.status != "FALLBACK_GREEDY" and len(res.allocations) == len(jobs):
                return res
            # the MILP left a job out (charges can outweigh a job's worth where two
            # offloading jobs would share a node): keep it unless the greedy variant,
            # placing one job at a time, starts more
            greedy = self._greedy(view, jobs, nodes)
            if res.status != "FALLBACK_GREEDY" and len(res.allocations) >= len(greedy):
                return res
        if greedy is None:
            greedy = self._greedy(view, jobs, nodes)
        return PlacementResult(tuple(greedy), status="GREEDY")

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
        probe = next(j for j in jobs if view.job(j.job_id) is not None)
        for n in nodes:
            vt = f"{n.gpu_type}~{_bucket(view, probe, n.node_id)}"
            rep.setdefault(vt, n.node_id)
            vnodes.append(NodeFree(n.node_id, vt, n.free_milli))
        base = {vt: vt.split("~", 1)[0] for vt in rep}
        vjobs = [_virtual(j, base) for j in jobs]
        vspeed = {vt: speed.get(t, 1.0) for vt, t in base.items()}
        scale = milp.config.weights.value_scale
        cache: dict[tuple[str, str, int], int] = {}
        top: dict[str, int] = {}  # job -> its raw charge on its dearest class

        def raw(job: JobRequest, vt: str, extra: int = 0) -> int:
            key = (job.job_id, vt, extra)
            if key not in cache:
                cost = offload_cost(view, job, rep[vt], extra) if vt in rep else 0.0
                g = job.num_gpus * job.gpu_milli / 1000
                share = WEIGHT * min(cost, 1.0)
                cache[key] = round(scale * g * job.weight * vspeed.get(vt, 1.0) * share)
            return cache[key]

        def charge(job: JobRequest, vt: str) -> int:
            if job.job_id not in top:
                top[job.job_id] = max(raw(job, v) for v in rep if job.allows(v))
            return raw(job, vt) - top[job.job_id]

        streaming = [j for j in vjobs if view.job(j.job_id) is not None and j.gpu_milli >= 1000]
        together = SameRound(streaming, raw)
        return milp.place_charged(vjobs, vnodes, vspeed, charge, together)

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


class SameRound:
    """What offloading jobs started together on one node cost each other (S_n above):
    a `Contention` for the MILP's objective (objective.py)."""

    def __init__(
        self, streaming: Sequence[JobRequest], charge: Callable[[JobRequest, str, int], int]
    ) -> None:
        self._ids = {j.job_id for j in streaming}
        self._jobs = streaming
        self._charge = charge
        self._extra: dict[tuple[str, int, int], float] = {}  # (t~b, k, o) -> C̄(o−k) − C̄(0)

    def streams(self, job: JobRequest) -> bool:
        return job.job_id in self._ids

    def cost(self, gpu_type: str, slots: Sequence[tuple[int, int]]) -> int:
        o = sum(k * c for k, c in slots)
        return round(sum(c * self._slot(gpu_type, k, o) for k, c in slots))

    def _slot(self, vt: str, k: int, o: int) -> float:
        key = (vt, k, o)
        v = self._extra.get(key)
        if v is None:
            like = [j for j in self._jobs if j.num_gpus == k and j.allows(vt)]
            diffs = [self._charge(j, vt, o - k) - self._charge(j, vt, 0) for j in like]
            v = self._extra[key] = sum(diffs) / len(diffs) if diffs and o > k else 0.0
        return v


def _bucket(view: OffloadView, probe: JobRequest, node_id: str) -> str:
    """A node's offload class: offloading GPUs streaming there (0 .. 8+), and how much
    the window's first offloading job would slow them (Δ, in steps)."""
    b = view.streams_on(node_id)
    if not b:
        return "0"
    spec = view.job(probe.job_id)
    assert spec is not None
    caused = view.estimate(spec[0], spec[1], node_id, probe.num_gpus)[1]
    step = sum(1 for edge in DELTA_STEPS if caused >= edge)
    return f"{min(b, BUCKETS)}~{step}"


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
