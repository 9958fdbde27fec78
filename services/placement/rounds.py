"""The placement service's state and its answer to a round (pure: no bus).

Placement keeps its own view of the free GPUs (`FreeView`, from `cluster.nodes`)
and the accepted jobs, and solves with the placer `rltune simulate` uses
(`services.placement.registry.make_placer`) inside the order rule and the
queueing discipline (`shared.sched.ordered.OrderedPlacer`), as the
simulator does:

* free rounds: a `PriorityBatch` from scoring is solved over the batch's jobs
  that are not already placed and waiting to start; what it gives away is taken
  off the view at once, so the next batch never gets the same GPU even before
  the executor's next `NodeStatus` (and the executor refuses any GPU that is
  not really free with `rejected_placement`).
* driven rounds (lockstep): the executor's `place` request names the window its
  simulator hands the placer; it is answered once every node status of that
  round (named by the round's `score` request) has been seen, so the solve sees
  exactly the simulator's free GPUs. An offload-aware placer's view of the running
  offloading jobs is rebuilt from the request (`offloading`) before the solve.
* driven re-placement (`NAME+offload+replace`): the executor's `replace` request
  (its own round id, naming the node states stamped with it) is answered, once they
  are seen, with a batch of no assignments and at most one move (moves.py), decided
  on the executor's free GPUs and running offloading jobs.
"""

from __future__ import annotations

import math
import time
from collections import Counter

from services.placement.moves import RunningOffloads
from services.placement.view import FreeView
from shared.cluster import ClusterSpec
from shared.messages import (
    Assignment,
    Job,
    JobEvent,
    MoveOrder,
    NodeStatus,
    PlacementBatch,
    RoundRequest,
)
from shared.placement_api import (
    FULL_GPU,
    Allocation,
    JobRequest,
    PlacementResult,
    Release,
    RoundContext,
)
from shared.sched.ordered import OrderedPlacer
from shared.sched.replacement import Move, QueuePlan
from shared.speeds import speed_of

__all__ = ["PlacementState", "job_request"]


def job_request(job: Job, score: float, est_run_s: float = 0.0) -> JobRequest:
    milli = job.gpu_milli if job.num_gpus == 1 else FULL_GPU
    return JobRequest(
        job.job_id, job.num_gpus, milli, frozenset(job.gpu_types), job.weight, score, est_run_s
    )


def round_context(req: RoundRequest, node_type: dict[str, str]) -> RoundContext:
    """What EASY reserves against, as the executor's request states it."""
    releases = [
        Release(
            r.time_s, Allocation(r.job_id, tuple((n, tuple(g)) for n, g in r.gpus), r.gpu_milli)
        )
        for r in req.releases
    ]
    return RoundContext(req.time, releases, node_type)


class PlacementState:
    def __init__(self, placer: OrderedPlacer, cluster: ClusterSpec | None) -> None:
        self.placer = placer
        self.view = FreeView(cluster)
        self.jobs: dict[str, Job] = {}
        self.placed: set[str] = set()  # given GPUs, not yet started or refused
        self.gone: set[str] = set()  # started (or ended): never placed again in free rounds
        self.round_nodes: dict[int, list[str]] = {}  # driven: nodes each round waits for
        self.pending: dict[int, RoundRequest] = {}  # driven place requests not yet answered
        self.answered: dict[int, PlacementBatch] = {}  # driven: the last answers (resends)
        self.solve_ms: list[float] = []
        self.counts: Counter[str] = Counter()
        # an offload-aware placer (NAME+offload...) reads the running offloading jobs
        # through the cost model over the cluster spec's nodes (moves.py)
        inner = placer.inner
        self.offload: RunningOffloads | None = None
        if cluster is not None and hasattr(inner, "offload_view"):
            self.offload = RunningOffloads(cluster)
            setattr(inner, "offload_view", self.offload.state)  # noqa: B010

    # ---- inputs -------------------------------------------------------------------------
    def accepted(self, job: Job) -> None:
        self.jobs.setdefault(job.job_id, job)
        if self.offload is not None:
            self.offload.accepted(job)

    def node(self, status: NodeStatus) -> None:
        self.view.update(status)

    def event(self, ev: JobEvent) -> None:
        if self.offload is not None:
            self.offload.event(ev)
        if ev.kind in ("started", "finished", "failed", "cancelled"):
            self.placed.discard(ev.job_id)
            self.gone.add(ev.job_id)
        elif ev.kind in ("rejected_placement", "preempted"):
            self.placed.discard(ev.job_id)
            if ev.kind == "preempted":  # back in the queue (a refused move: it runs on)
                self.gone.discard(ev.job_id)
            if ev.kind == "rejected_placement":
                self.counts["rejected_placement"] += 1

    # ---- free rounds --------------------------------------------------------------------
    def free_round(
        self, round_id: int, now: float, jobs: list[tuple[str, float]]
    ) -> PlacementBatch:
        reqs = [
            job_request(self.jobs[jid], score)
            for jid, score in jobs
            if jid in self.jobs and jid not in self.placed and jid not in self.gone
        ]
        self.counts["unknown_jobs"] += sum(1 for jid, _ in jobs if jid not in self.jobs)
        batch = self._solve(round_id, now, reqs, moves=True)
        for a in batch.assignments:
            self.placed.add(a.job_id)
        return batch

    # ---- driven rounds ------------------------------------------------------------------
    def request(self, req: RoundRequest) -> None:
        if req.phase in ("score", "replace"):
            self.round_nodes[req.round_id] = list(req.nodes)
        if req.phase != "score":
            self.pending[req.round_id] = req

    def answer_rounds(self) -> list[PlacementBatch]:
        out = []
        for rid in sorted(self.pending):
            req = self.pending[rid]
            if rid in self.answered:  # asked again (the executor resent it): same answer
                del self.pending[rid]
                out.append(self.answered[rid])
                continue
            if self.waiting_for(req):
                break
            del self.pending[rid]
            if self.offload is not None:  # the executor's running offloading jobs
                self.offload.load(req.time, req.offloading, self.jobs)
            if req.phase == "replace":
                batch = self._replace(req)
                self.answered = {rid: batch}
                self.round_nodes = {r: n for r, n in self.round_nodes.items() if r > rid}
                out.append(batch)
                continue
            est = req.estimates or [0.0] * len(req.jobs)
            reqs = [
                job_request(self.jobs[jid], s, e) for (jid, s), e in zip(req.jobs, est, strict=True)
            ]
            ctx = round_context(req, self._node_type()) if req.estimates else None
            batch = self._solve(rid, req.time, reqs, ctx)
            self.answered = {rid: batch}
            self.round_nodes = {r: n for r, n in self.round_nodes.items() if r > rid}
            out.append(batch)
        return out

    def waiting_for(self, req: RoundRequest) -> list[str]:
        nodes = self.round_nodes.get(req.round_id)
        if nodes is None:
            return [f"score request of round {req.round_id}"]
        miss = [f"job {j}" for j, _ in req.jobs if j not in self.jobs]
        miss += [f"job {r.job_id}" for r in req.offloading if r.job_id not in self.jobs]
        return miss + [f"node {n}" for n in nodes if self.view.round_of.get(n, -1) < req.round_id]

    def _replace(self, req: RoundRequest) -> PlacementBatch:
        """A driven re-placement round: at most one move (none without re-placement)."""
        t0 = time.perf_counter()
        orders = []
        if self.offload is not None:
            speed = self._speed()
            free = self.view.free_nodes()
            queue = self._queue_plan(req)
            mv = self.offload.move(self.placer.inner, req.time, free, speed, req.window, queue)
            if mv is not None:
                orders.append(self._order(mv))
        return PlacementBatch(
            round_id=req.round_id,
            time=req.time,
            assignments=[],
            solver_ms=(time.perf_counter() - t0) * 1e3,
            solver_status="REPLACE",
            moves=orders,
        )

    def _queue_plan(self, req: RoundRequest) -> QueuePlan | None:
        """Re-placement's queue check from a replace request (replace.py): its `jobs`
        (waiting, arrival order) with `estimates`, and `releases` (expected ends)."""
        cfg = getattr(self.placer.inner, "replace", None)
        if cfg is None or cfg.queue_check == "off":
            return None
        free = sum(row.count(FULL_GPU) for row in (n.free_milli for n in self.view.free_nodes()))
        running = [
            (r.job_id, r.time_s, sum(len(g) for _, g in r.gpus) if r.gpu_milli >= FULL_GPU else 0)
            for r in req.releases
        ]
        est = req.estimates or [0.0] * len(req.jobs)
        waiting = [
            (jid, self.jobs[jid].num_gpus, e) for (jid, _), e in zip(req.jobs, est, strict=True)
        ]
        return QueuePlan(req.time, free, running, waiting)

    def _order(self, mv: Move) -> MoveOrder:
        """Issue `mv`: its GPUs taken off the view at once (as for a placement)."""
        self.view.take([mv.alloc])
        self.counts["moves"] += 1
        gpus = [Assignment(mv.job_id, n, list(g)) for n, g in mv.alloc.gpus]
        return MoveOrder(mv.job_id, gpus, mv.cost_s, mv.saved_s)

    def _speed(self) -> dict[str, float]:
        cluster = self.view.cluster
        return {t: speed_of(t, cluster.speed) for t in cluster.gpu_types}

    # ---- the solve ----------------------------------------------------------------------
    def _node_type(self) -> dict[str, str]:
        return {n.node_id: n.gpu_type for n in self.view.cluster.nodes}

    def _solve(
        self,
        round_id: int,
        now: float,
        reqs: list[JobRequest],
        ctx: RoundContext | None = None,
        moves: bool = False,
    ) -> PlacementBatch:
        """Solve one round; with `moves` (free rounds: driven ones ask for moves in
        `replace` requests of their own) also ask for one re-placement move (moves.py)."""
        speed = self._speed()
        t0 = time.perf_counter()
        result: PlacementResult = (
            self.placer.place(reqs, self.view.free_nodes(), speed, ctx)
            if reqs
            else PlacementResult(())
        )
        wall_ms = (time.perf_counter() - t0) * 1e3
        self.solve_ms.append(wall_ms)
        self.counts["rounds"] += 1
        self.view.take(result.allocations)
        orders = []
        if self.offload is not None:
            for a in result.allocations:
                self.offload.given_gpus(a)
        if self.offload is not None and moves:
            waiting = len(reqs) - len(result.allocations)
            mv = self.offload.move(self.placer.inner, now, self.view.free_nodes(), speed, waiting)
            if mv is not None:
                orders.append(self._order(mv))
        return PlacementBatch(
            round_id=round_id,
            time=now,
            assignments=[
                Assignment(a.job_id, node, list(gpus))
                for a in result.allocations
                for node, gpus in a.gpus
            ],
            solver_ms=result.solver_ms or wall_ms,
            solver_status=result.status if reqs else "EMPTY",
            extra={k: float(v) for k, v in result.extra.items() if math.isfinite(v)},
            moves=orders,
        )
