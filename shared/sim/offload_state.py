"""Offloading jobs in the simulator: who streams on which node, how slow it makes them.

`OffloadState` keeps, per node, the offloading GPUs running there, and per
offloading job its per-GPU demand (offload_jobs.synth_profile planned and
replayed: offload_traffic.py) on each node type. When a job starts or stops,
the jobs sharing a node with it get new slowdowns (offload_cost.py), and the
simulator moves their finish times. It is also the view placement reads
(`estimate`): the slowdown a job would have on a node, and the one it would
add to the offloading jobs already there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.cluster import ClusterSpec
from shared.offload.planner import Budgets
from shared.offload_signal import offload_pressure
from shared.sim.offload_cost import (
    FAST_SHARE,
    GPU_MEM_GIB,
    HOST_SHARE,
    TOKENS_PER_GPU_STEP,
    V100_FLOPS,
    JobDemand,
    StepCost,
    default_calibration,
)
from shared.sim.offload_jobs import BYTES_PER_PARAM, synth_profile
from shared.sim.offload_traffic import step_traffic
from shared.speeds import speed_of

__all__ = ["OffloadRecord", "OffloadState"]

_GIB = 1 << 30
_ESTIMATES_KEPT = 1 << 18  # estimates kept by node signature before starting afresh


@dataclass
class OffloadRecord:
    """What one offloading job's migrations did over its run (in-process `OffloadStats`)."""

    job_id: str
    param_bytes: int
    unhidden_s: float = 0.0  # run time added by copies that compute did not hide
    run_s: float = 0.0  # time it held GPUs
    hits_weighted: float = 0.0  # ∫ hit rate dt
    latency_weighted: float = 0.0  # ∫ mean copy latency (ms) dt
    bytes_moved: float = 0.0  # per GPU, into and out of the fast tier
    slowdowns: list[float] = field(default_factory=list)  # every slowdown it ran at

    @property
    def hit_rate(self) -> float:
        return self.hits_weighted / self.run_s if self.run_s > 0 else 1.0

    @property
    def migration_ms(self) -> float:
        """Mean time of one tensor copy, over its run."""
        return self.latency_weighted / self.run_s if self.run_s > 0 else 0.0


class OffloadState:
    def __init__(self, cluster: ClusterSpec, hidden_fraction: float | None = None) -> None:
        self.h = (
            default_calibration().hidden_fraction if hidden_fraction is None else hidden_fraction
        )
        self.nodes = cluster.nodes
        self.index = {n.node_id: i for i, n in enumerate(cluster.nodes)}
        self.streams = [0] * len(cluster.nodes)  # offloading GPUs running on each node
        self.on_node: list[set[int]] = [set() for _ in cluster.nodes]  # seqs running there
        ref = speed_of("V100", cluster.speed)
        self.rel_speed = {t: speed_of(t, cluster.speed) / ref for t in cluster.gpu_types}
        self.param_bytes: dict[int, int] = {}  # seq -> parameter bytes (offloading jobs)
        self.gpus: dict[int, int] = {}  # seq -> GPUs of the job
        self.by_id: dict[str, int] = {}  # job id -> seq (offloading jobs)
        self.placed: dict[int, dict[int, int]] = {}  # running seq -> node index -> GPUs
        self._demand: dict[tuple[int, int, int, int], JobDemand] = {}
        self.version = 0  # bumped at every start and stop (what free_gbps depends on)
        self._free: dict[frozenset[str], float] = {}  # free_gbps at `_free_version`
        self._free_version = -1
        self._gbps: dict[str, float] = {}  # demand_gbps by job id
        self._sig: dict[str, tuple[object, ...]] = {}  # signature by node at `_sig_version`
        self._sig_version = -1
        self._estimates: dict[tuple[object, ...], tuple[float, float]] = {}  # `estimate`

    # ---- what a job asks -------------------------------------------------------------
    def add_job(self, seq: int, job_id: str, param_bytes: int, gpus: int) -> None:
        self.param_bytes[seq] = param_bytes
        self.gpus[seq] = gpus
        self.by_id[job_id] = seq

    def job(self, job_id: str) -> tuple[int, int] | None:
        """(param bytes, GPUs) of an offloading job; None if it does not offload."""
        seq = self.by_id.get(job_id)
        return None if seq is None else (self.param_bytes[seq], self.gpus[seq])

    def demand(self, param_bytes: int, gpus: int, node: int) -> JobDemand:
        """Per-GPU demand of a job of this size on node `node`'s budgets (cached)."""
        n = self.nodes[node]
        fast = int(GPU_MEM_GIB.get(n.gpu_type, 16.0) * FAST_SHARE * _GIB)
        host = int(n.host_mem_gib / max(n.gpus, 1) * HOST_SHARE * _GIB)
        key = (param_bytes, gpus, fast, host)
        d = self._demand.get(key)
        if d is None:
            profile = synth_profile("sim", param_bytes, gpus, (fast, host))
            traffic = step_traffic(profile, "tencache", Budgets(fast, host))
            params = param_bytes / BYTES_PER_PARAM
            compute_ms = 6 * params * TOKENS_PER_GPU_STEP / V100_FLOPS * 1e3
            d = self._demand[key] = JobDemand(traffic, compute_ms)
        return d

    def moves(self, param_bytes: int, gpus: int, node: int) -> bool:
        """Whether a job of this size streams anything on node `node`: one whose
        parameters and optimizer states fit the node's GPU budget moves no byte and
        takes no share of its bandwidth."""
        return self.demand(param_bytes, gpus, node).traffic.bytes_moved > 0

    def demand_of(self, seq: int) -> JobDemand:
        """The running job's demand on its first node."""
        return self.demand(self.param_bytes[seq], self.gpus[seq], next(iter(self.placed[seq])))

    def cost(self, seq: int, node: int, streams: int) -> StepCost:
        n = self.nodes[node]
        d = self.demand(self.param_bytes[seq], self.gpus[seq], node)
        share = max(streams, 1)
        return d.cost(self.rel_speed[n.gpu_type], n.pcie_gbps / share, n.nvme_gbps / share, self.h)

    def step(self, seq: int) -> StepCost:
        """The job's step now: at its slowest node (synchronous data parallel)."""
        return max(
            (self.cost(seq, i, self.streams[i]) for i in self.placed[seq]),
            key=lambda c: c.slowdown,
        )

    # ---- starts and stops ------------------------------------------------------------
    def start(self, seq: int, nodes: Iterable[tuple[int, int]]) -> set[int]:
        """Job `seq` starts with (node index, GPUs) parts; the running offloading jobs
        whose rate changes (itself included). Its GPUs share a node's bandwidth only
        where it moves bytes (`moves`)."""
        placed = dict(nodes)
        self.placed[seq] = placed
        self.version += 1
        touched = {seq}
        for i, g in placed.items():
            if self.moves(self.param_bytes[seq], self.gpus[seq], i):
                self.streams[i] += g
                self.on_node[i].add(seq)
                touched |= self.on_node[i]
        return touched

    def stop(self, seq: int) -> set[int]:
        placed = self.placed.pop(seq)
        self.version += 1
        touched: set[int] = set()
        for i, g in placed.items():
            if seq in self.on_node[i]:
                self.streams[i] -= g
                self.on_node[i].discard(seq)
                touched |= self.on_node[i]
        return touched

    # ---- what placement reads ----------------------------------------------------------
    def estimate(
        self, param_bytes: int, gpus: int, node_id: str, take: int, extra: int = 0
    ) -> tuple[float, float]:
        """(slowdown of a job of this size taking `take` GPUs of `node_id`, slowdown it
        adds in total to the offloading jobs already there, Σ over their GPUs of
        f_after − f_before, per GPU of the new job). `extra`: offloading GPUs placed
        there meanwhile (the same round), counted as streams. A multi-node job's part
        on the node is at most the node's GPUs (`take` is cut to them). A job that
        moves nothing there (`moves`) has slowdown 1 and adds none."""
        i = self.index[node_id]
        n = self.nodes[i]
        take = min(take, n.gpus)
        # everything read below is the node's type and GPU count, its signature (its
        # bandwidths, host memory per GPU and the offloading jobs on it: streams[i] is
        # the sum of their GPUs there) and h, so the answer is kept by those across
        # starts and stops: the placer asks the same of many nodes and rounds
        key = (param_bytes, gpus, take, extra, n.gpu_type, n.gpus, self.signature(node_id))
        got = self._estimates.get(key)
        if got is None:
            if len(self._estimates) >= _ESTIMATES_KEPT:
                self._estimates.clear()
            got = self._estimates[key] = self._estimate(param_bytes, gpus, i, take, extra)
        return got

    def _estimate(
        self, param_bytes: int, gpus: int, i: int, take: int, extra: int
    ) -> tuple[float, float]:
        n = self.nodes[i]
        d = self.demand(param_bytes, gpus, i)
        if d.traffic.bytes_moved == 0:
            return 1.0, 0.0
        s = self.streams[i] + extra + take
        rel = self.rel_speed[n.gpu_type]
        own = d.cost(rel, n.pcie_gbps / s, n.nvme_gbps / s, self.h).slowdown
        caused = 0.0
        # in the signature's order, so that nodes of one signature sum alike to the bit
        here = sorted(
            self.on_node[i], key=lambda q: (self.param_bytes[q], self.gpus[q], self.placed[q][i])
        )
        for seq in here:
            g = self.placed[seq][i]
            before = self.cost(seq, i, self.streams[i] + extra).slowdown
            caused += g * (self.cost(seq, i, s).slowdown - before)
        return own, caused / max(take, 1)

    def relief(self, seq: int) -> float:
        """Slowdown the running job `seq` leaving would take off the other offloading
        jobs on its nodes (Σ over their GPUs there of f_now − f_without, per GPU of
        `seq`): the ρ of services/placement/replace.py."""
        total = 0.0
        for i, mine in self.placed[seq].items():
            if seq not in self.on_node[i]:
                continue
            s = self.streams[i]
            for o in self.on_node[i]:
                if o != seq:
                    now, after = self.cost(o, i, s).slowdown, self.cost(o, i, s - mine).slowdown
                    total += self.placed[o][i] * (now - after)
        return total / max(self.gpus[seq], 1)

    def moves_on(self, param_bytes: int, gpus: int, node_id: str) -> bool:
        """`moves` by node id (what placement reads)."""
        return self.moves(param_bytes, gpus, self.index[node_id])

    def streams_on(self, node_id: str) -> int:
        return self.streams[self.index[node_id]]

    def signature(self, node_id: str) -> tuple[object, ...]:
        """What `estimate` reads of a node besides its GPU type and GPU count: its PCIe
        and NVMe GB/s, host memory per GPU, and the offloading jobs on it ((parameter
        bytes, GPUs, GPUs there), sorted). Two nodes of one type with equal signatures
        give every job that fits on either the same estimate (a larger part of a
        multi-node job only fits the larger)."""
        if self._sig_version != self.version:
            self._sig, self._sig_version = {}, self.version
        got = self._sig.get(node_id)
        if got is None:
            got = self._sig[node_id] = self._signature(self.index[node_id])
        return got

    def _signature(self, i: int) -> tuple[object, ...]:
        n = self.nodes[i]
        here = sorted(
            (self.param_bytes[s], self.gpus[s], self.placed[s][i]) for s in self.on_node[i]
        )
        return (n.pcie_gbps, n.nvme_gbps, n.host_mem_gib / max(n.gpus, 1), tuple(here))

    # ---- what the policy reads (shared/offload_signal.py) ------------------------------
    def demand_gbps(self, job_id: str) -> float:
        """GB/s the job's GPUs would stream alone on a node like the cluster's first."""
        spec = self.job(job_id)
        if spec is None:
            return 0.0
        got = self._gbps.get(job_id)
        if got is None:
            pbytes, gpus = spec
            cost = self._alone(pbytes, gpus, 0)
            d = self.demand(pbytes, gpus, 0)
            got = gpus * d.traffic.bytes_moved / cost.step_ms / 1e6 if cost.step_ms else 0.0
            self._gbps[job_id] = got
        return got

    def _alone(self, pbytes: int, gpus: int, node: int) -> StepCost:
        n = self.nodes[node]
        d = self.demand(pbytes, gpus, node)
        return d.cost(self.rel_speed[n.gpu_type], n.pcie_gbps, n.nvme_gbps, self.h)

    def free_gbps(self, types: frozenset[str]) -> float:
        """Σ over nodes of the types (empty: all) of PCIe GB/s not streamed now."""
        if self._free_version != self.version:
            self._free, self._free_version = {}, self.version
        got = self._free.get(types)
        if got is None:
            got = self._free[types] = self._free_gbps(types)
        return got

    def _free_gbps(self, types: frozenset[str]) -> float:
        used = [0.0] * len(self.nodes)
        for seq, placed in self.placed.items():
            for i, g in placed.items():
                cost = self.cost(seq, i, self.streams[i])
                moved = self.demand(self.param_bytes[seq], self.gpus[seq], i).traffic.bytes_moved
                used[i] += g * moved / cost.step_ms / 1e6 if cost.step_ms else 0.0
        return sum(
            max(0.0, n.pcie_gbps - used[i])
            for i, n in enumerate(self.nodes)
            if not types or n.gpu_type in types
        )

    def pressure(self, job_id: str, types: frozenset[str]) -> float:
        """The policy feature `offload_pressure` of a waiting job."""
        return offload_pressure(self.demand_gbps(job_id), self.free_gbps(types))
