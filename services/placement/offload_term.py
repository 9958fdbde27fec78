"""Placement that knows offloading: the slowdown an offloading job would suffer, and
cause to the offloading jobs already there, charged on each node class.

`OffloadAwarePlacer` wraps the MILP or the greedy placer. It reads an
`OffloadView` (in simulation, the simulator's shared.sim.offload_state.OffloadState):
which window jobs offload, a node's signature (what the cost model reads of it),
and the cost model's estimate for a job on a node. Windows without an offloading job go to
the wrapped placer unchanged.

MILP. The node classes gain a bandwidth dimension where offloading jobs run: a
node of type t becomes type "t~i", same speed, i its class among the nodes of
type t by what the cost model reads of it (OffloadView.signature: its PCIe and
NVMe GB/s, host memory per GPU, and the offloading jobs streaming there with
their sizes and GPUs on it). Nodes of one class give every job that fits them
the same estimate, so one member (the one with the most GPUs, for a multi-node
job's largest part) stands for all of them; nodes without offloading jobs stay
one class per type and hardware. Jobs allowed t may
use every t~i. For an offloading job j on class c = t~i the objective is charged

    raw_j,c = round(value_scale · g_j · w_j · speed_t · WEIGHT · x)
    x       = (1 − 1/f_j) + Δ_j
    C_j,c   = raw_j,c − max_{c' allowed} raw_j,c'

f_j the job's own slowdown on a node of the class with its GPUs added (a
multi-node job: its part there, at most the node's GPUs; it runs at its slowest
node, and all its parts are on one class), Δ_j the slowdown it adds to the
offloading jobs already there (Σ over them of f_after − f_before, per GPU of j):
x is the share of a GPU's throughput the placement loses. x is not capped: a
heavy streamer (T5-3B on one P100: f = 2.2 alone) beside one other already has
x > 1, and a cap at 1 made a node with one such neighbour cost the same as a
node with five (docs/results/offload-placement-results.md, marking seeds 0-2: without the
cap the cut is 3 points larger at two seeds and 0.7 smaller at the third, and
the jobs that do not offload are no longer slower at one). C joins T_j,t (the
Scorer's per-job, per-type cost), so it is in the model, the warm start, the
one-job enumeration and the greedy comparison alike. Measured from the job's
dearest class, C is a bonus (≤ 0) that never makes a job less worth starting
than without the term (ordered.py chooses which jobs start, and the MILP's
answer must start exactly those); only where it starts changes. WEIGHT = 16 job
values per lost GPU makes the offload estimate outweigh the fragmentation
differences between places (chosen on the tuning slices of
docs/design/offload-scheduling.md, "Placement").

Jobs of one window placed on one node share its bandwidth too. The whole-GPU
slots of offloading single-node jobs are slot kinds of their own, one per job
kind (parameter bytes, GPUs, weight: jobs of one kind have the same raw charge
everywhere), key k + kind · classes.STREAM, so each node pattern says which
offloading jobs it starts together there, and the pattern is charged what they
cost each other (objective.py's S_n):

    S_c(pattern) = Σ_{streaming slots s of kind κ, k GPUs} (raw_κ,c(o − k) − raw_κ,c(0))

raw_κ,c(e) the raw charge of a job of kind κ on class c computed with e more
offloading GPUs on the node, o the pattern's streaming GPUs (one slot alone
costs nothing more; two or more pay for each other). Multi-node jobs' parts stay
plain slots (not charged for the window's other offloading jobs on their nodes).

Greedy. The same estimate per node: an offloading job goes to the nodes of the
cheapest estimate (rounded to 0.01) that can hold it whole, then the next, and
so on (greedy.py's rule within each); a job no node holds whole is spread over
the cheapest nodes that can hold it together; others are placed as greedy.py
places them.

Re-placement (`replace`, set for `NAME+offload+replace`): between rounds, a
running offloading job that has run well past its estimate may be moved to free
GPUs where the same placer, with the same charge, puts it alone, if its time per
unit of work falls enough to pay for the checkpoint and restart (replace.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial

from services.placement.classes import STREAM, slot_gpus
from services.placement.milp import MilpPlacer
from services.placement.replace import choose_move
from services.placement.state import apply_allocations
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree, PlacementResult, Placer
from shared.sched.greedy import greedy_allocations
from shared.sched.replacement import Move, OffloadView, QueuePlan, ReplaceConfig, RunningOffload

__all__ = [
    "WEIGHT",
    "OffloadAwarePlacer",
    "SameRound",
    "offload_classes",
    "offload_cost",
]

WEIGHT = 16.0  # charge per GPU of throughput lost, in job values per GPU (module doc)


def offload_cost(view: OffloadView, job: JobRequest, node_id: str, extra: int = 0) -> float:
    """(1 − 1/f) + Δ of the job on the node (0 for a job that does not offload)."""
    spec = view.job(job.job_id)
    if spec is None:
        return 0.0
    own, caused = view.estimate(spec[0], spec[1], node_id, job.num_gpus, extra)
    return (1.0 - 1.0 / own) + caused


class OffloadAwarePlacer:
    def __init__(self, inner: Placer, replace: ReplaceConfig | None = None) -> None:
        self.inner = inner
        self.replace = replace  # re-placement of running offloading jobs (None: off)
        self.name = f"{inner.name}+offload" + ("+replace" if replace is not None else "")
        self.leaves_cycles = bool(getattr(inner, "leaves_cycles", False))
        self.offload_view: OffloadView | None = None  # set by the simulator

    @property
    def cycles(self) -> int:
        """The wrapped placer's calls that left garbage cycles (the simulator, which
        pauses the GC, collects by this count; without it nothing was collected)."""
        return int(getattr(self.inner, "cycles", 0))

    def replacement(
        self,
        running: Sequence[RunningOffload],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        waiting: int = 0,
        queue: QueuePlan | None = None,
    ) -> Move | None:
        """A running offloading job worth moving onto the free `nodes`, and where
        (replace.py; `waiting`: how many jobs wait; `queue`: what the queue check
        reads); None if re-placement is off or none is."""
        view = self.offload_view
        if self.replace is None or view is None or not running:
            return None

        def place(job: JobRequest, free: Sequence[NodeFree]) -> Allocation | None:
            got = self.place([job], free, speed).allocations
            return got[0] if got else None

        def klass(n: NodeFree) -> Hashable:
            return (n.gpu_type, len(n.free_milli), view.signature(n.node_id))

        # the view keeps its estimates by node signature (OffloadState.estimate)
        return choose_move(
            running, nodes, speed, self.replace, view.estimate, place, klass, waiting, queue
        )

    def place(
        self, jobs: Sequence[JobRequest], nodes: Sequence[NodeFree], speed: Mapping[str, float]
    ) -> PlacementResult:
        view = self.offload_view
        if view is None or not any(_streams(view, j, nodes) for j in jobs):
            # no window job moves a byte on any node it may use: nothing to charge
            return self.inner.place(jobs, nodes, speed)
        if not isinstance(self.inner, MilpPlacer):
            return PlacementResult(tuple(self._greedy(view, jobs, nodes)), status="GREEDY")
        res = self._milp(self.inner, view, jobs, nodes, speed)
        solved = res.status != "FALLBACK_GREEDY"
        if not (solved and len(res.allocations) == len(jobs)):
            # the MILP left a job out (charges can outweigh a job's worth where two
            # offloading jobs would share a node): keep it unless the greedy variant,
            # placing one job at a time, starts more
            greedy = self._greedy(view, jobs, nodes)
            if not (solved and len(res.allocations) >= len(greedy)):
                res = PlacementResult(tuple(greedy), status="GREEDY")
        return self._plain_others(view, res, jobs, nodes, speed)

    def _plain_others(
        self,
        view: OffloadView,
        res: PlacementResult,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
    ) -> PlacementResult:
        """The jobs that do not offload placed by the wrapped placer alone on what the
        offloading jobs' allocations leave, so the node classes and charges decide only
        where offloading jobs go, never the others' tie-breaks. The joint answer stands
        if the wrapped placer would leave out one of those it started."""
        placed = {a.job_id for a in res.allocations}
        others = [j for j in jobs if view.job(j.job_id) is None and j.job_id in placed]
        if not others:
            return res
        ids = {j.job_id for j in others}
        own = tuple(a for a in res.allocations if a.job_id not in ids)
        left = apply_allocations(list(nodes), own)
        got = self.inner.place(others, left, speed)
        if len(got.allocations) < len(others):
            return res
        return PlacementResult(
            own + tuple(got.allocations), res.solver_ms, res.status, res.objective, res.extra
        )

    # ---- MILP: node classes by bandwidth use, the charge in the objective --------------
    def _milp(
        self,
        milp: MilpPlacer,
        view: OffloadView,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
    ) -> PlacementResult:
        vtype = offload_classes(view, nodes)
        # virtual type -> the member with the most GPUs (all members give a job that
        # fits them the same estimate; a multi-node job's largest part is its slowest)
        rep: dict[str, NodeFree] = {}
        vnodes = []
        for n in nodes:
            vt = vtype[n.node_id]
            if vt not in rep or len(n.free_milli) > len(rep[vt].free_milli):
                rep[vt] = n
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
                cost = offload_cost(view, job, rep[vt].node_id, extra) if vt in rep else 0.0
                g = job.num_gpus * job.gpu_milli / 1000
                cache[key] = round(scale * g * job.weight * vspeed.get(vt, 1.0) * WEIGHT * cost)
            return cache[key]

        def charge(job: JobRequest, vt: str) -> int:
            if job.job_id not in top:
                top[job.job_id] = max(raw(job, v) for v in rep if job.allows(v))
            return raw(job, vt) - top[job.job_id]

        def moves(job: JobRequest, vt: str) -> bool:
            spec = view.job(job.job_id)
            return spec is not None and vt in rep and view.moves_on(*spec, rep[vt].node_id)

        streaming = [j for j in vjobs if view.job(j.job_id) is not None and j.gpu_milli >= 1000]
        together = SameRound(streaming, raw, partial(_kind_of, view), moves)
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
                pbytes, g = view.job(job.job_id) or (0, 0)
                for node_id, idx in got[0].gpus if got else ():
                    if view.moves_on(pbytes, g, node_id):
                        added[node_id] = added.get(node_id, 0) + len(idx)
            if got:
                out += got
                free = apply_allocations(free, got)
        return out


class SameRound:
    """What offloading jobs started together on one node cost each other (S_n above):
    a `Contention` for the MILP's objective (objective.py). `kind_of` keys jobs that
    cost alike; `charge(job, class, e)` is raw_j,c with e more offloading GPUs there;
    `moves(job, class)` whether the job streams there at all (the GPUs of one that
    does not are not counted in o; its own charge is 0)."""

    def __init__(
        self,
        streaming: Sequence[JobRequest],
        charge: Callable[[JobRequest, str, int], int],
        kind_of: Callable[[JobRequest], Hashable],
        moves: Callable[[JobRequest, str], bool] | None = None,
    ) -> None:
        self._kind: dict[str, int] = {}  # job id -> kind (1, 2, ..)
        self._rep: list[JobRequest] = []  # kind − 1 -> its first job
        kinds: dict[Hashable, int] = {}
        for j in streaming:
            key = kind_of(j)
            if key not in kinds:
                self._rep.append(j)
                kinds[key] = len(self._rep)
            self._kind[j.job_id] = kinds[key]
        self._charge = charge
        self._moves = moves
        self._moving: dict[tuple[str, int], bool] = {}  # (class, key) -> streams there
        self._extra: dict[tuple[str, int, int], int] = {}  # (class, key, o) -> slot's S

    def kind(self, job: JobRequest) -> int:
        return self._kind.get(job.job_id, 0)

    def cost(self, gpu_type: str, slots: Sequence[tuple[int, int]]) -> int:
        moving = [(key, c) for key, c in slots if self._streams(gpu_type, key)]
        o = sum(slot_gpus(key) * c for key, c in moving)
        return sum(c * self._slot(gpu_type, key, o) for key, c in moving)

    def _streams(self, vt: str, key: int) -> bool:
        if self._moves is None:
            return True
        got = self._moving.get((vt, key))
        if got is None:
            got = self._moving[(vt, key)] = self._moves(self._rep[key // STREAM - 1], vt)
        return got

    def _slot(self, vt: str, key: int, o: int) -> int:
        k = slot_gpus(key)
        if o <= k:
            return 0
        v = self._extra.get((vt, key, o))
        if v is None:
            rep = self._rep[key // STREAM - 1]
            v = self._charge(rep, vt, o - k) - self._charge(rep, vt, 0)
            self._extra[(vt, key, o)] = v
        return v


def offload_classes(view: OffloadView, nodes: Sequence[NodeFree]) -> dict[str, str]:
    """Node id -> its class "t~i": i numbers the distinct signatures of type t's nodes
    (in an order that does not depend on the nodes' order)."""
    sig = {n.node_id: (n.gpu_type, view.signature(n.node_id)) for n in nodes}
    index: dict[tuple[str, tuple[object, ...]], str] = {}
    count: dict[str, int] = {}
    for t, s in sorted(set(sig.values()), key=repr):
        index[(t, s)] = f"{t}~{count.get(t, 0)}"
        count[t] = count.get(t, 0) + 1
    return {node_id: index[key] for node_id, key in sig.items()}


def _streams(view: OffloadView, job: JobRequest, nodes: Sequence[NodeFree]) -> bool:
    """Whether an offloading job moves bytes on some node it may use."""
    spec = view.job(job.job_id)
    return spec is not None and any(
        view.moves_on(*spec, n.node_id) for n in nodes if job.allows(n.gpu_type)
    )


def _kind_of(view: OffloadView, job: JobRequest) -> Hashable:
    return (view.job(job.job_id), job.num_gpus, job.gpu_milli, job.weight)


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
    """The job on the nodes of the cheapest estimate that can hold it whole (greedy.py's
    rule among them); a job no node holds whole is spread (greedy.py's rule) over the
    cheapest nodes that can hold it together."""
    tiers: dict[float, list[NodeFree]] = {}
    whole: dict[float, list[NodeFree]] = {}
    for n in nodes:
        if job.allows(n.gpu_type) and n.free_milli and max(n.free_milli) >= job.gpu_milli:
            c = round(cost(n.node_id), 2)
            tiers.setdefault(c, []).append(n)
            if _holds(n, job):
                whole.setdefault(c, []).append(n)
    for c in sorted(whole):
        got = greedy_allocations([job], whole[c])
        if got:
            return got
    pool: list[NodeFree] = []
    for c in sorted(tiers):
        pool += tiers[c]
        got = greedy_allocations([job], pool)
        if got:
            return got
    return []


def _holds(n: NodeFree, job: JobRequest) -> bool:
    if job.gpu_milli < FULL_GPU:
        return bool(n.free_milli) and max(n.free_milli) >= job.gpu_milli
    return sum(1 for f in n.free_milli if f >= FULL_GPU) >= job.num_gpus
