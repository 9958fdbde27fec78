"""The placement objective, in integers, shared by the MILP and by everything that
scores a placement (the MILP's greedy comparison, the benchmark, the tests).

    objective = Σ_{placed j on type t} (V_j,t − T_j,t)             (throughput)
              − Σ_n (P_n(after) − P_n(before))                     (fragmentation)
              − spread_weight · Σ_j (nodes of j − 1)               (spread)
              − Σ_n S_n                                            (same-round streams)

    V_j,t = round(value_scale · g_j · w_j · π_j · speed_t)
    g_j   = num_gpus_j · gpu_milli_j / 1000       GPUs the job holds
    π_j   = 1 + position_weight · (J − i_j) / J    window position i_j = 0 .. J−1
    T_j,t = round(type_weight · value_scale · k_j·m_j/1000 · (σ(κ_t) − min_{t' ∈ T_j} σ(κ_t')))
    σ(κ)  = κ / (1 + κ); κ_t: pressure of type-restricted demand on t (Workload.pressure):
            taking a pressed type costs at most type_weight of the job's value
    P_n   = round(frag_weight · node term) + Σ_g round(frag_weight · GPU term)

with the node and GPU terms of the ATC'23 fragmentation F_n (frag.py). A job
spread over nodes of several types runs at the slowest type's speed. S_n is 0
unless a `Contention` is given (offload_term.py): then the whole-GPU slots of
offloading jobs are slot kinds of their own (k + kind · classes.STREAM, one kind
per offloading job kind) and S_n charges what the single-node offloading jobs
started together on node n cost each other.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.placement.classes import STREAM
from services.placement.frag import Workload
from services.placement.state import apply_allocations
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree

__all__ = ["Contention", "ObjectiveWeights", "Scorer"]


class Contention(Protocol):
    """What jobs placed together on one node in one window cost each other."""

    def kind(self, job: JobRequest) -> int:
        """The job's streaming kind (>= 1; jobs of one kind cost alike), 0 if its
        whole-GPU slots are plain (it does not offload)."""
        ...

    def cost(self, gpu_type: str, slots: Sequence[tuple[int, int]]) -> int:
        """S_n of one node of `gpu_type` given (slot key, slots) of the streaming slots
        it receives this window (key = GPUs + kind · STREAM); 0 for a single slot."""
        ...


@dataclass(frozen=True, slots=True)
class ObjectiveWeights:
    value_scale: float = 1000.0  # per milli-GPU of placed demand; makes any fit beat its penalty
    position_weight: float = 1.0  # how much more the head of the window is worth than its tail
    frag_weight: float = 1.0  # per milli-GPU of fragmentation created
    spread_weight: float = 500.0  # per node beyond the first of a multi-node job (½ GPU)
    leftover_weight: float = 0.0  # per milli left free on a partially used GPU (best-fit term)
    type_weight: float = 0.5  # share of value_scale per GPU on a more pressed type (< 1)


class Scorer:
    """Objective coefficients of one window, and the objective of a concrete placement."""

    def __init__(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        weights: ObjectiveWeights,
        workload: Workload,
        pressure: Mapping[str, float] | None = None,
        charge: Callable[[JobRequest, str], int] | None = None,
        contention: Contention | None = None,
    ) -> None:
        self.jobs = jobs
        # extra cost of a job on a type (offload_term.py: migration slowdown), else none
        self.charge = charge
        # cost of streaming slots sharing a node (offload_term.py), else none
        self.contention = contention
        self.pressure = pressure or {}  # κ_t of each GPU type
        self.nodes = nodes
        self.speed = speed
        self.weights = weights
        self.workload = workload
        n = len(jobs) or 1
        # priority factor of each job, by window position (first = most urgent)
        self._prio = [1.0 + weights.position_weight * (n - i) / n for i in range(len(jobs))]
        self._pos = {j.job_id: i for i, j in enumerate(jobs)}
        self._node_pen: dict[tuple[str, int], int] = {}
        self._gpu_pen: dict[tuple[str, int], int] = {}

    def value(self, j: int, gpu_type: str) -> int:
        """V_j,t: worth of starting job `j` (window position) on type `gpu_type`."""
        job = self.jobs[j]
        gpus = job.num_gpus * job.gpu_milli
        speed = self.speed.get(gpu_type, 1.0)
        return round(self.weights.value_scale * gpus * job.weight * self._prio[j] * speed / 1000)

    def type_pen(self, j: int, gpu_type: str) -> int:
        """T_j,t: cost of taking type t's capacity, that type-restricted jobs will need,
        rather than that of the job's least pressed allowed type. Below V_j,t / 2."""
        job = self.jobs[j]
        extra = self.charge(job, gpu_type) if self.charge is not None else 0
        allowed = [t for t in self.pressure if job.allows(t)]
        if not allowed:
            return extra
        least = min(self._squash(t) for t in allowed)
        gpus = job.num_gpus * job.gpu_milli / 1000
        press = self._squash(gpu_type) - least
        return round(self.weights.type_weight * self.weights.value_scale * gpus * press) + extra

    def slot_key(self, job: JobRequest) -> int:
        """The slot kind the job fills: its share (milli), its GPUs, or its GPUs +
        kind · STREAM when it streams (classes.py)."""
        if job.gpu_milli < FULL_GPU:
            return job.gpu_milli
        kind = self.contention.kind(job) if self.contention is not None else 0
        return job.num_gpus + STREAM * kind

    def pattern_charge(self, gpu_type: str, sizes: Sequence[int], pattern: Sequence[int]) -> int:
        """S_n of a node pattern (counts over slot keys `sizes`)."""
        if self.contention is None:
            return 0
        slots = [(k, c) for k, c in zip(sizes, pattern, strict=True) if c and k > STREAM]
        return self.contention.cost(gpu_type, slots) if slots else 0

    def _squash(self, gpu_type: str) -> float:
        k = self.pressure.get(gpu_type, 0.0)
        return k / (1.0 + k)  # κ / (1 + κ) in [0, 1)

    def node_pen(self, gpu_type: str, whole_free: int) -> int:
        """Penalty of a node's `whole_free` untouched GPUs (integer part of P_n)."""
        key = (gpu_type, whole_free)
        v = self._node_pen.get(key)
        if v is None:
            raw = self.workload.table(gpu_type).node(whole_free)
            v = self._node_pen[key] = round(self.weights.frag_weight * raw)
        return v

    def gpu_pen(self, gpu_type: str, free: int) -> int:
        """Penalty of one partially used GPU with `free` milli left."""
        key = (gpu_type, free)
        v = self._gpu_pen.get(key)
        if v is None:
            raw = self.workload.table(gpu_type).gpu(free)
            left = free if 0 < free < FULL_GPU else 0
            w = self.weights
            v = self._gpu_pen[key] = round(w.frag_weight * raw + w.leftover_weight * left)
        return v

    def node_penalty(self, node: NodeFree) -> int:
        whole = sum(1 for f in node.free_milli if f >= FULL_GPU)
        t = node.gpu_type
        return self.node_pen(t, whole) + sum(self.gpu_pen(t, f) for f in node.free_milli)

    def evaluate(self, allocs: Sequence[Allocation]) -> int:
        """Objective of placing `allocs` (assumed feasible) on the window's cluster."""
        by_id = {n.node_id: n for n in self.nodes}
        value = 0
        spread = 0
        touched: set[str] = set()
        streaming: dict[str, list[tuple[int, int]]] = defaultdict(list)  # node -> slots
        for a in allocs:
            job = self.jobs[self._pos[a.job_id]]
            key = self.slot_key(job)
            if len(a.gpus) == 1 and key > STREAM:
                streaming[a.gpus[0][0]].append((key, 1))
            types = [by_id[n].gpu_type for n in a.node_ids]
            slowest = min(types, key=lambda t: self.speed.get(t, 1.0))
            value += self.value(self._pos[a.job_id], slowest)
            value -= self.type_pen(self._pos[a.job_id], types[0])
            spread += len(a.gpus) - 1
            touched.update(a.node_ids)
        after = {n.node_id: n for n in apply_allocations(self.nodes, allocs)}
        frag = sum(self.node_penalty(after[n]) - self.node_penalty(by_id[n]) for n in touched)
        same = sum(
            self.contention.cost(by_id[n].gpu_type, slots)
            for n, slots in streaming.items()
            if self.contention is not None
        )
        return value - frag - round(self.weights.spread_weight * spread) - same
