r"""MILP placement: which jobs of the prioritised window start now, and where.

One CP-SAT model per window, over shape classes (classes.py) instead of nodes.

Data
    J            window jobs, position i_j = 0 (most urgent) .. |J|-1
    k_j, m_j     GPUs and milli-GPU per GPU of job j (m_j < 1000: one shared GPU)
    T_j          GPU types job j may use (allowed, and some class can hold it)
    C = (t, W)   node classes: nodes of type t with W whole free GPUs; N_c members
    G = (t, f)   GPU classes: partially used GPUs of type t with f milli free; N_g members
    F_t          the "fresh" GPU class of type t: whole free GPUs opened to sharing
    P_c          node patterns: count vectors p over whole slot sizes k with Σ p_k·k ≤ W
                 (a size-1 slot is either a 1-GPU job or a GPU opened to sharing)
    Q_g          GPU patterns: count vectors q over share sizes m with Σ q_m·m ≤ f
                 (f = 1000 for F_t); patterns are non-empty and never use more
                 slots of a size than the window has jobs of it

Decision variables
    y_{j,t} ∈ {0,1}          job j starts on type t
    z_{c,p} ∈ {0..N_c}       nodes of class c that take node pattern p
    o_t ∈ Z+                 whole free GPUs of type t opened to sharing jobs
    v_{g,q} ∈ {0..N_g}       GPUs of class g (or F_t) that take GPU pattern q

Constraints
    Σ_t y_{j,t} ≤ 1                                   gang: all of a job or nothing, once
    Σ_p z_{c,p} ≤ N_c,   Σ_q v_{g,q} ≤ N_g             each member takes at most one pattern
    Σ_q v_{F_t,q} = o_t                               every opened GPU holds shares
    ∀t,k: Σ_{j: k_j=k, m_j=1000} y_{j,t} + [k=1]·o_t = Σ_{c∈t,p} p_k·z_{c,p}
                                                       whole slots offered = slots used
    ∀t,m: Σ_{j: m_j=m} y_{j,t} = Σ_{g∈t ∪ F_t, q} q_m·v_{g,q}
                                                       share slots offered = shares placed
    (y_{j,t} exists only for t ∈ T_j: allowed types only.) A node pattern packs
    whole slots on one node, so a single-node job never straddles nodes; a GPU
    pattern packs shares on one GPU, so shares never exceed a GPU.

Objective (objective.py; all coefficients integers)
    max Σ_{j,t} (V_{j,t} − T_{j,t})·y_{j,t}
        − Σ_{c,p} (P^node_t(W − |p|) − P^node_t(W))·z_{c,p}
        − Σ_{g,q} (P^gpu_t(f − |q|) − P^gpu_t(f))·v_{g,q}
    V_{j,t} = value_scale · k_j·m_j/1000 · weight_j · π_j · speed_t
    T_{j,t} = type_weight · value_scale · k_j·m_j/1000 · (σ(κ_t) − min_{t'∈T_j} σ(κ_t'))
              σ(κ) = κ/(1+κ), κ_t the pressure of type-restricted demand on t (frag.py)
    π_j = 1 + position_weight·(|J| − i_j)/|J|        (head of the window is worth more)
    P^node, P^gpu: the node and GPU terms of the ATC'23 fragmentation F_n (frag.py),
    so the penalty is exactly the fragmentation the placement adds.
    With a same-window contention (place_charged; offload_term.py), an offloading
    job's whole slots are a slot kind of their own (size k + STREAM, classes.py)
    and each node pattern's coefficient also carries − S_t(p), what the streaming
    slots it holds cost each other; Scorer.evaluate charges the same per node.

Multi-node jobs (more GPUs than any allowed node has whole free) take parts:
    y_{j,t} ∈ {0,1}, r_{j,t,s} ∈ Z+ parts of s GPUs (s: the whole-free counts of
    type-t nodes, and 1, 2, 4),  Σ_t y_{j,t} ≤ 1,  Σ_s s·r_{j,t,s} = k_j·y_{j,t},
    and the parts join the whole-slot balance of type t like single-node jobs;
    objective + (V_{j,t} − T_{j,t})·y_{j,t} − spread_weight·(Σ_s r_{j,t,s} − y_{j,t}),
    so a job on more nodes than needed pays per extra node (as few nodes as
    possible). One type per multi-node job. One the model leaves out is spread
    after the solve on what is left, fewest nodes first (greedy.py's rule).

Size. Only nodes the window could touch are kept (per type and free shape, as
many as the window has jobs that fit them: relevant_nodes). y_{j,t} is built
as x_{j,s} (speed group s of t) and n_{c,t} (members of job class c on t), with
identical jobs forming one class and symmetry broken by value (milp_jobs.py),
so the model grows with distinct shapes, job kinds and patterns, not with nodes
or jobs. Patterns past max_patterns per class are cut (fullest kept, reported).

Time. One wall-clock budget per call (MilpConfig.time_limit_s) covers building
too; CP-SAT gets what is left (one worker, no probing, one presolve pass). A
class-level greedy in priority order scored by this objective (milp_hint.py) is
the complete warm-start hint. On timeout the best solution found is decoded
(TIMEOUT_FEASIBLE), or the hint itself when CP-SAT had none yet or no time was
left (TIMEOUT_HINT); with no solution at all, greedy.py's placement is returned
(FALLBACK_GREEDY). The status and the wall time come with every result.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from services.placement.classes import index_classes
from services.placement.frag import Workload
from services.placement.milp_hint import class_greedy_hint
from services.placement.milp_model import WindowModel
from services.placement.objective import Contention, ObjectiveWeights, Scorer
from services.placement.state import apply_allocations
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree, PlacementResult
from shared.sched.greedy import greedy_allocations

__all__ = ["MilpConfig", "MilpPlacer", "relevant_nodes"]


@dataclass(frozen=True, slots=True)
class MilpConfig:
    time_limit_s: float = 0.036  # wall-clock budget of one place(); CP-SAT gets what is left
    solver_overhead_s: float = 0.004  # CP-SAT's own start and stop, outside its limit
    min_solve_s: float = 0.005  # with less left than this, the warm start is the answer
    workers: int = 1  # CP-SAT search workers (this machine has 2 cores; 1 is fastest at ms scale)
    max_patterns: int = 400  # per class; beyond it the pattern list is cut (reported)
    warm_start: str = "classes"  # hint: "classes" (milp_hint.py) or "first-fit" (greedy.py)
    weights: ObjectiveWeights = field(default_factory=ObjectiveWeights)
    # Reproducible mode (the simulator): instead of the wall-clock budget, CP-SAT stops
    # after this much of its own deterministic time, so the same window gets the same
    # answer on any machine under any load. None: the wall-clock budget (services).
    deterministic_time: float | None = None
    # A window of one single-node job is solved by scoring each distinct place it could
    # take (exact; most simulation rounds start one job). False: always build the model.
    enumerate_single: bool = True


# windows remembered by a reproducible MILP placer (the memo is emptied when full)
MEMO_SIZE = 20_000


@dataclass(frozen=True, slots=True)
class _Memo:
    """A solved window by positions: (job, ((node, GPU indices), ...), milli) per
    allocation, job and node positions in the window and in the kept nodes."""

    allocations: tuple[tuple[int, tuple[tuple[int, tuple[int, ...]], ...], int], ...]
    status: str
    objective: float | None
    extra: dict[str, float]

    @classmethod
    def of(cls, r: PlacementResult, jobs: Sequence[JobRequest], nodes: Sequence[NodeFree]) -> _Memo:
        jpos = {j.job_id: i for i, j in enumerate(jobs)}
        npos = {n.node_id: i for i, n in enumerate(nodes)}
        allocs = tuple(
            (jpos[a.job_id], tuple((npos[n], idx) for n, idx in a.gpus), a.gpu_milli)
            for a in r.allocations
        )
        timing = ("build_ms", "cpsat_ms")
        extra = {k: v for k, v in r.extra.items() if k not in timing}
        return cls(allocs, r.status, r.objective, extra)


class MilpPlacer:
    """The CP-SAT placer. `workload` is the fragmentation target (default: the window)."""

    name = "milp"
    leaves_cycles = True  # OR-Tools model objects: a caller that pauses the GC must collect

    def __init__(self, config: MilpConfig | None = None, workload: Workload | None = None) -> None:
        self.config = config or MilpConfig()
        self.workload = workload
        self.cycles = 0  # models built so far (each leaves garbage cycles)
        # node penalties P_n by (workload, GPU type, free shape): they depend on nothing
        # else, and one-job windows of a few shapes recur all through a simulation
        self._pens: dict[object, dict[tuple[str, tuple[int, ...]], int]] = {}
        self._charge: Callable[[JobRequest, str], int] | None = None  # place_charged's
        self._contention: Contention | None = None  # place_charged's
        # reproducible solves by their inputs, names left out (_memo_key): a window seen
        # before gets the answer the solve gave it, renamed
        self._memo: dict[Hashable, _Memo] = {}
        self.memo_hits = 0  # windows answered from the memo
        self._workloads: dict[tuple[tuple[int, int, frozenset[str]], ...], Workload] = {}

    def scorer(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        reduce: bool = True,
    ) -> Scorer:
        """The objective this placer optimises for a window, over its relevant nodes
        (over all of `nodes` when not `reduce`)."""
        workload = self.workload or self._workload_of(jobs)
        free_by_type: dict[str, float] = {}
        for n in nodes:
            free_by_type[n.gpu_type] = free_by_type.get(n.gpu_type, 0.0) + sum(n.free_milli)
        pressure = workload.pressure(free_by_type)
        kept = relevant_nodes(jobs, nodes) if reduce else nodes
        w = self.config.weights
        return Scorer(jobs, kept, speed, w, workload, pressure, self._charge, self._contention)

    def _workload_of(self, jobs: Sequence[JobRequest]) -> Workload:
        """Workload.of(jobs), one per window composition (its fragmentation tables
        are filled once, not per call)."""
        key = tuple((j.num_gpus, j.gpu_milli, j.gpu_types) for j in jobs)
        got = self._workloads.get(key)
        if got is None:
            if len(self._workloads) >= MEMO_SIZE:
                self._workloads.clear()
            got = self._workloads[key] = Workload.of(jobs)
        return got

    def place_charged(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        charge: Callable[[JobRequest, str], int],
        contention: Contention | None = None,
    ) -> PlacementResult:
        """`place` with `charge(job, type)` added to the objective's per-job, per-type
        cost T, and what jobs started together on one node cost each other
        (`contention`, objective.py) (offload_term.py)."""
        self._charge, self._contention = charge, contention
        try:
            return self.place(jobs, nodes, speed)
        finally:
            self._charge, self._contention = None, None

    def place(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
    ) -> PlacementResult:
        # no garbage-collection pause inside the time budget (it is restored after)
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._place(jobs, nodes, speed)
        finally:
            if paused:
                gc.enable()

    def _place(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
    ) -> PlacementResult:
        t0 = time.perf_counter()
        cfg = self.config
        # by name: equal nodes are told apart by name, never by their order in the input
        nodes = sorted(nodes, key=_node_name)
        if cfg.enumerate_single and len(jobs) == 1 and not _split(jobs, nodes)[1]:
            # one single-node job: its distinct places scored, no model needed
            scorer = self.scorer(jobs, nodes, speed, reduce=False)
            pens = self._pens.setdefault(scorer.workload.shapes, {})
            got = _best_single(jobs[0], nodes, scorer, pens)
            return PlacementResult(
                allocations=tuple(a for _, a in got),
                solver_ms=(time.perf_counter() - t0) * 1e3,
                status="OPTIMAL",
                objective=float(got[0][0]) if got else 0.0,
                extra={"enumerated": 1.0},
            )
        scorer = self.scorer(jobs, nodes, speed)
        nodes = scorer.nodes
        key = self._memo_key(jobs, scorer, speed)
        if key is not None and key in self._memo:
            self.memo_hits += 1
            return self._recall(self._memo[key], jobs, nodes, t0)
        result = self._solve(jobs, nodes, speed, scorer, t0)
        if key is not None:
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = _Memo.of(result, jobs, nodes)
        return result

    def _memo_key(
        self, jobs: Sequence[JobRequest], scorer: Scorer, speed: Mapping[str, float]
    ) -> Hashable | None:
        """What a reproducible solve of this window depends on, node and job names left
        out: job shapes and weights by window position, the kept nodes' types and free
        GPUs in name order, each type's pressure, the speeds. None: not memoised (the
        wall-clock budget, or a per-job charge)."""
        if self.config.deterministic_time is None or self._charge is not None:
            return None
        return (
            tuple((j.num_gpus, j.gpu_milli, j.gpu_types, j.weight) for j in jobs),
            tuple((n.gpu_type, n.free_milli) for n in scorer.nodes),
            tuple(sorted(scorer.pressure.items())),
            tuple(sorted(speed.items())),
        )

    def _recall(
        self, memo: _Memo, jobs: Sequence[JobRequest], nodes: Sequence[NodeFree], t0: float
    ) -> PlacementResult:
        allocs = tuple(
            Allocation(jobs[j].job_id, tuple((nodes[n].node_id, idx) for n, idx in parts), milli)
            for j, parts, milli in memo.allocations
        )
        ms = (time.perf_counter() - t0) * 1e3
        extra = {**memo.extra, "memo": 1.0}
        return PlacementResult(allocs, ms, memo.status, memo.objective, extra)

    def _solve(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        scorer: Scorer,
        t0: float,
    ) -> PlacementResult:
        cfg = self.config
        single, multi = _split(jobs, nodes)
        classes = index_classes(nodes)
        self.cycles += 1
        model = WindowModel(jobs, single, nodes, classes, scorer, cfg.max_patterns, multi)
        if cfg.warm_start == "first-fit":
            model.hint([a for a in greedy_allocations(jobs, nodes) if len(a.gpus) == 1])
        else:
            class_greedy_hint(model)
        t1 = time.perf_counter()
        if cfg.deterministic_time is not None:
            out = model.solve(0.0, cfg.workers, deterministic_time=cfg.deterministic_time)
        else:
            left = cfg.time_limit_s - (t1 - t0) - cfg.solver_overhead_s
            out = model.solve(left if left >= cfg.min_solve_s else 0.0, cfg.workers)
        t2 = time.perf_counter()
        if out.status in ("OPTIMAL", "TIMEOUT_FEASIBLE", "TIMEOUT_HINT"):
            allocs = list(out.allocations)
            started = {a.job_id for a in allocs}
            rest = [j for j in multi if jobs[j].job_id not in started]
            allocs += _spread(jobs, rest, apply_allocations(nodes, allocs))
            status = out.status
        else:  # no solution in time: the greedy placement in priority order
            allocs, status = greedy_allocations(jobs, nodes), "FALLBACK_GREEDY"
        return PlacementResult(
            allocations=tuple(allocs),
            solver_ms=(time.perf_counter() - t0) * 1e3,
            status=status,
            objective=float(scorer.evaluate(allocs)),
            extra={
                "build_ms": (t1 - t0) * 1e3,
                "cpsat_ms": (t2 - t1) * 1e3,
                "bound": out.bound,
                "variables": float(out.variables),
                "patterns_truncated": float(out.truncated),
            },
        )


def relevant_nodes(jobs: Sequence[JobRequest], nodes: Sequence[NodeFree]) -> list[NodeFree]:
    """The nodes a placement of `jobs` could touch, in input order.

    Nodes of one type and free shape are interchangeable, and a window touches
    at most as many of them as it has jobs that fit them (a multi-node job
    counts its GPUs); keep that many of each shape, first by node name. greedy.py,
    which breaks ties between equal nodes by name, places exactly as on all nodes.
    """
    demand = Counter((j.num_gpus, j.gpu_milli, j.gpu_types) for j in jobs)
    shapes: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, n in enumerate(nodes):
        shapes.setdefault((n.gpu_type, n.free_milli), []).append(i)
    keep: list[int] = []
    for (t, free), members in shapes.items():
        whole = sum(1 for f in free if f >= FULL_GPU)
        cap = 0
        for (k, milli, types), count in demand.items():
            if types and t not in types:
                continue
            if milli < FULL_GPU:
                cap += count if max(free) >= milli else 0
            elif whole:
                cap += count * (1 if k <= whole else k)
        keep += sorted(members, key=lambda i: nodes[i].node_id)[:cap]
    return [nodes[i] for i in sorted(keep)]


def _best_single(
    job: JobRequest,
    nodes: Sequence[NodeFree],
    scorer: Scorer,
    pens: dict[tuple[str, tuple[int, ...]], int],
) -> list[tuple[int, Allocation]]:
    """The optimum for a window of one single-node job, and its objective, by scoring
    every distinct place it could take: each (type, free shape) of node, and for a share
    each distinct free value of a GPU there. With one job on one node the objective is
    V - T - (P_n after - P_n before) (objective.py), so this is exactly the model's
    optimum; ties go to the first in node order."""
    best: tuple[int, Allocation] | None = None
    seen: set[tuple[str, tuple[int, ...], int]] = set()
    shapes: set[tuple[str, tuple[int, ...]]] = set()  # whole-GPU job: node shapes scored
    gain: dict[str, int] = {}
    k, milli = job.num_gpus, job.gpu_milli
    for n in nodes:
        t, free = n.gpu_type, n.free_milli
        if not job.allows(t):
            continue
        options: list[tuple[int, tuple[int, ...]]] = []  # (free of the GPU taken, GPUs)
        if milli < FULL_GPU:
            options = [(f, (g,)) for g, f in enumerate(free) if f >= milli]
        else:  # one place per node shape: the first whole free GPUs
            if (t, free) in shapes:
                continue
            shapes.add((t, free))
            idx = tuple(g for g, f in enumerate(free) if f >= FULL_GPU)[:k]
            if len(idx) == k:
                options = [(0, idx)]
        for key, idx in options:
            if (t, free, key) in seen:
                continue
            seen.add((t, free, key))
            row = list(free)
            for g in idx:
                row[g] -= milli
            if t not in gain:
                gain[t] = scorer.value(0, t) - scorer.type_pen(0, t)
            value = gain[t] - _pen(t, tuple(row), scorer, pens) + _pen(t, free, scorer, pens)
            if best is None or value > best[0]:
                best = (value, Allocation(job.job_id, ((n.node_id, idx),), milli))
    return [] if best is None else [best]


def _node_name(n: NodeFree) -> str:
    return n.node_id


def _pen(
    t: str, free: tuple[int, ...], scorer: Scorer, pens: dict[tuple[str, tuple[int, ...]], int]
) -> int:
    v = pens.get((t, free))
    if v is None:
        v = pens[(t, free)] = scorer.node_penalty(NodeFree("", t, free))
    return v


def _split(jobs: Sequence[JobRequest], nodes: Sequence[NodeFree]) -> tuple[list[int], list[int]]:
    """Window positions of single-node candidates, and of multi-node jobs."""
    max_whole: dict[str, int] = {}
    for n in nodes:
        max_whole[n.gpu_type] = max(max_whole.get(n.gpu_type, 0), n.free_milli.count(FULL_GPU))
    single: list[int] = []
    multi: list[int] = []
    for j, job in enumerate(jobs):
        fits_one = max((w for t, w in max_whole.items() if job.allows(t)), default=0)
        if job.gpu_milli < FULL_GPU or job.num_gpus <= fits_one:
            single.append(j)
        else:
            multi.append(j)
    return single, multi


def _spread(
    jobs: Sequence[JobRequest], multi: Sequence[int], left: Sequence[NodeFree]
) -> list[Allocation]:
    """Multi-node jobs on the capacity the solution left, fewest nodes first (greedy.py)."""
    if not multi:
        return []
    return greedy_allocations([jobs[j] for j in multi], left)
