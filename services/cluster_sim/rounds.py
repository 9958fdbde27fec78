"""The simulated cluster's side of a round over the bus (pure: no bus).

cluster_sim runs the one simulator (`shared.sim.Simulator`) with the simulator's
own clock, and hands it a `Policy` and a `Placer` that ask the services instead
of deciding themselves:

* `RemotePolicy.window(k, obs)` is the start of round r: the node states that
  changed since the last round (`NodeStatus` stamped with r), the job events
  since then, and a `RoundRequest(score)` naming the jobs that arrived, started
  and finished, go out; the answer is scoring's `PriorityBatch` of round r.
* `RemotePlacer.place(window, nodes, speed, ctx)` sends `RoundRequest(place)`
  with the window the simulator hands its placer (the simulator's own choice of
  candidates, queue limits and all, with the history estimates and, under EASY,
  the running jobs' expected releases) and returns placement's `PlacementBatch`
  (placement applies the order rule and the discipline around its placer).
* With an offload-aware placer (`NAME+offload...`) every place request carries the
  running offloading jobs (`RoundRequest.offloading`), so placement's offload view is
  the simulator's. With `NAME+offload+replace` the simulator's re-placement check
  (after a round, at every finish and at least hourly) asks placement instead of a
  placer of its own: a `RoundRequest(replace)` with its own round id, the node states
  changed since they were last published (stamped with that id, and published again
  with the next score round) and the running offloading jobs; placement answers with
  at most one `MoveOrder`, which the simulator applies as in-process
  (`Simulator._move`: the old GPUs freed, the restore charged on the new ones) and
  reports as a `started` event of the running job on its new nodes (a move whose GPUs
  are not free: `rejected_placement`). Up to `_MOVES_PER_CHECK` requests per check,
  each on the state the previous move left, as in-process.
* With `--preempt` and a preemptive policy (`las`), the simulator stops running
  jobs as `simulate --preempt` does: which ones is a pure function of attained
  service (`rank`, `next_threshold`), computed here by the same policy class; each
  stop goes out as a `preempted` event and in the next round's `preempted` list,
  and scoring puts the job back in its queue with the service it attained.
* With queue guarantees in the cluster file, the simulator's reclaim
  (shared/sim/reclaim.py) stops borrowers as `simulate` does: each stop is a
  `preempted` event and an entry of the next round's `preempted` list. The
  reclaiming job's start, asked of the placer between rounds, goes with a score
  round of its own (`Rounds._stale`): placement answers a place request once, by
  round id, on the node states that round names.

Everything else (arrivals from the trace, run times, finishes, conflicts, the
per-job records and the summary) is the simulator's, unchanged, so that the
same trace, cluster, policy, placer and seed give the same start times as
`rltune simulate`. The simulator runs in a worker thread; `Channel` is the
blocking call into the service's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Protocol

from services.placement.registry import OFFLOAD_SUFFIX, REPLACE_SUFFIX
from shared.cluster import ClusterSpec
from shared.messages import (
    ExpectedRelease,
    JobEvent,
    NodeStatus,
    OffloadRunning,
    OffloadStats,
    PlacementBatch,
    PriorityBatch,
    RoundRequest,
)
from shared.placement_api import Allocation, JobRequest, NodeFree, PlacementResult, RoundContext
from shared.policy_api import Observation, PolicyContext, QueuedJob
from shared.sched.replacement import Move, QueuePlan, ReplaceConfig, RunningOffload
from shared.sim.engine import SimConfig, Simulator
from shared.sim.observer import SimObserver
from shared.sim.run import Run
from shared.sim.state import Claim

log = logging.getLogger(__name__)

__all__ = ["BusEvents", "Channel", "RemotePlacer", "RemotePolicy", "Rounds", "bus_simulator"]


class Channel(Protocol):
    """The service's side: publish a round's messages and block until its answer."""

    def score(
        self,
        req: RoundRequest,
        nodes: list[NodeStatus],
        events: list[JobEvent],
        offload: list[OffloadStats],
    ) -> PriorityBatch: ...

    def place(self, req: RoundRequest) -> PlacementBatch: ...

    def replace(self, req: RoundRequest, nodes: list[NodeStatus]) -> PlacementBatch: ...


@dataclass
class _Pending:
    arrived: list[str]
    started: list[str]
    finished: list[str]
    events: list[JobEvent]
    preempted: list[str]

    @classmethod
    def empty(cls) -> _Pending:
        return cls([], [], [], [], [])


class Rounds:
    """Round ids, what happened since the last round, and the node states last sent."""

    def __init__(self, channel: Channel, window: int) -> None:
        self.channel = channel
        self.window = window
        self.sim: Simulator | None = None
        self.round_id = -1
        self.now = 0.0
        self.pending = _Pending.empty()
        self.requeue: str | None = None  # the job being put back by a preemption
        self.sent: dict[int, tuple[int, ...]] = {}  # node index -> free row last published
        # ... with a replace request since the last score round (published again with it)
        self.sent_replace: dict[int, tuple[int, ...]] = {}
        self.offload_aware = False  # the placer reads the running offloading jobs
        self.bad_moves = 0  # moves of jobs that are not running offloading jobs here
        self.by_id: dict[str, QueuedJob] = {}  # waiting jobs, as the simulator holds them
        self.unknown = 0  # job ids in an answer that are not waiting here
        self.answer: tuple[float, list[str]] | None = None  # (time, window) of the last round
        self.placed_round = -1  # the round of the last place request
        self.extra_rounds = 0  # score rounds sent for a place asked between rounds (reclaim)
        self.fallbacks = 0  # answers whose placer broke the order (placement replaced them)
        self.offload: list[OffloadStats] = []  # offloading jobs' rate changes since last round

    def score(self, k: int, now: float, fresh: bool = False) -> list[QueuedJob]:
        """The policy's first `k` waiting jobs. A round asks for the whole window; a
        second question at the same instant with nothing changed since (the simulator
        asks for the head alone under EASY, then for the window) is answered from the
        same round: scoring's state and clock are the same, so is its answer. `fresh`:
        a new round whatever changed (a place request goes with a round of its own)."""
        p = self.pending
        unchanged = not (p.arrived or p.started or p.finished or p.events or p.preempted)
        if not fresh and unchanged and self.answer is not None and self.answer[0] == now:
            nodes = self._changed_nodes(now)
            if not nodes:
                return self._jobs(self.answer[1][:k])
        else:
            nodes = self._changed_nodes(now)
        self.round_id += 1
        self.now = now
        self.pending = _Pending.empty()
        for n in nodes:
            n.round_id = self.round_id
        req = RoundRequest(
            round_id=self.round_id,
            time=now,
            phase="score",
            window=max(k, self.window),
            arrived=p.arrived,
            started=p.started,
            finished=p.finished,
            nodes=[n.node_id for n in nodes],
            preempted=p.preempted,
        )
        offload, self.offload = self.offload, []
        batch = self.channel.score(req, nodes, p.events, offload)
        ids = [jid for jid, _ in batch.jobs]
        self.answer = (now, ids)
        return self._jobs(ids[:k])

    def _jobs(self, ids: list[str]) -> list[QueuedJob]:
        out = []
        for jid in ids:
            job = self.by_id.get(jid)
            if job is None:
                self.unknown += 1
            else:
                out.append(job)
        return out

    def _stale(self) -> bool:
        """Whether the simulator's state moved since the last score round, or that
        round has had its place request already: a place asked now (a reclaim's start,
        between rounds: shared/sim/reclaim.py) needs a score round of its own, which
        carries the events since (the victims' `preempted`) and the node states
        placement solves on, under a round id placement has not answered yet."""
        p = self.pending
        if p.arrived or p.started or p.finished or p.events or p.preempted:
            return True
        if self.placed_round == self.round_id:
            return True
        assert self.sim is not None
        return any(self.sent.get(i) != tuple(row) for i, row in enumerate(self.sim.state.free))

    def place(self, jobs: Sequence[JobRequest], ctx: RoundContext | None) -> PlacementResult:
        if self.sim is not None and self._stale():
            self.extra_rounds += 1
            self.score(self.window, self.sim.obs.now, fresh=True)
        self.placed_round = self.round_id
        releases = [
            ExpectedRelease(
                r.time_s, r.alloc.job_id, [(n, list(g)) for n, g in r.alloc.gpus], r.alloc.gpu_milli
            )
            for r in (ctx.releases if ctx is not None else ())
        ]
        req = RoundRequest(
            round_id=self.round_id,
            time=self.now,
            phase="place",
            window=len(jobs),
            jobs=[(j.job_id, j.score) for j in jobs],
            estimates=[j.est_run_s for j in jobs] if ctx is not None else [],
            releases=releases,
            offloading=self.offloading() if self.offload_aware else [],
        )
        batch = self.channel.place(req)
        self.fallbacks += batch.solver_status.startswith("ORDER_")
        milli = {j.job_id: j.gpu_milli for j in jobs}
        gpus: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        for a in batch.assignments:
            gpus.setdefault(a.job_id, []).append((a.node_id, tuple(a.gpu_indices)))
            if self.sim is not None:  # republish it next round whatever the claim gives
                self.sent.pop(self.sim.state.index.get(a.node_id, -1), None)
        allocs = tuple(Allocation(jid, tuple(g), milli.get(jid, 1000)) for jid, g in gpus.items())
        return PlacementResult(allocs, batch.solver_ms, batch.solver_status, extra=batch.extra)

    def offloading(self) -> list[OffloadRunning]:
        """The running offloading jobs as the simulator holds them (in start order)."""
        sim = self.sim
        assert sim is not None
        now, st, out = sim.obs.now, sim.state, []
        for seq in sim.offload.placed:
            run = sim.runs[seq]
            elapsed = sum(s.finish_s - s.start_s for s in run.segments) + now - run.seg_start
            out.append(
                OffloadRunning(
                    job_id=run.job.job_id,
                    param_bytes=sim.offload.param_bytes[seq],
                    num_gpus=run.job.num_gpus,
                    gpus=[(st.node_ids[i], list(g)) for i, g in run.claim],
                    elapsed_s=elapsed,
                    est_run_s=run.est,
                    moved_s=now - run.seg_start if run.seg_restart > 0 else None,
                    restoring=now < run.restart_until,
                )
            )
        return out

    def replace(self, waiting: int, queue: QueuePlan | None = None) -> Move | None:
        """Ask placement for one move (a `replace` request); None if it sends none.
        `queue` (re-placement's queue check): its waiting jobs go out as `jobs` and
        `estimates`, the running jobs' expected ends as `releases`."""
        sim = self.sim
        assert sim is not None
        now = sim.obs.now
        self.round_id += 1
        nodes = []
        for i, row in enumerate(sim.state.free):
            t = tuple(row)
            if self.sent_replace.get(i, self.sent.get(i)) == t:
                continue
            self.sent_replace[i] = t
            st = sim.state
            nodes.append(node_status(st.node_ids[i], st.node_type[i], t, now, self.round_id))
        req = RoundRequest(
            round_id=self.round_id,
            time=now,
            phase="replace",
            window=waiting,
            nodes=[n.node_id for n in nodes],
            offloading=self.offloading(),
        )
        if queue is not None:
            req.jobs = [(jid, 0.0) for jid, _, _ in queue.waiting]
            req.estimates = [est for _, _, est in queue.waiting]
            held = {r.alloc.job_id: r.alloc for r in sim.backfill.releases.values()}
            req.releases = [
                ExpectedRelease(
                    end, jid, [(n, list(g)) for n, g in held[jid].gpus], held[jid].gpu_milli
                )
                for jid, end, _ in queue.running
            ]
        batch = self.channel.replace(req, nodes)
        self.placed_round = self.round_id  # answered: a place needs a round of its own
        for order in batch.moves[:1]:
            seq = sim.offload.by_id.get(order.job_id)
            if seq is None or seq not in sim.offload.placed or not order.assignments:
                self.bad_moves += 1
                return None
            job = sim.runs[seq].job
            gpus = [(a.node_id, tuple(a.gpu_indices)) for a in order.assignments]
            alloc = Allocation(job.job_id, tuple(gpus), job.gpu_milli)
            return Move(job.job_id, alloc, order.restart_s, 0.0, 0.0, order.saved_s)
        return None

    def flush(self) -> tuple[list[JobEvent], list[NodeStatus], list[OffloadStats]]:
        """The events, node changes and offload figures not yet sent (at the end)."""
        events, self.pending.events = self.pending.events, []
        offload, self.offload = self.offload, []
        now = max([self.now, *(e.time for e in events)])
        return events, self._changed_nodes(now, None), offload

    def _changed_nodes(self, now: float, round_id: int | None = -1) -> list[NodeStatus]:
        assert self.sim is not None
        rid = self.round_id if round_id == -1 else round_id
        st = self.sim.state
        out = []
        again, self.sent_replace = self.sent_replace, {}
        for i, row in enumerate(st.free):
            t = tuple(row)
            if self.sent.get(i) == t and i not in again:
                continue
            self.sent[i] = t
            out.append(node_status(st.node_ids[i], st.node_type[i], t, now, rid))
        return out


def node_status(
    node_id: str, gpu_type: str, row: tuple[int, ...], now: float, round_id: int | None
) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        gpu_type=gpu_type,
        gpus=len(row),
        free_gpus=[g for g, m in enumerate(row) if m == 1000],
        gpu_util=1.0 - sum(row) / (1000.0 * len(row)) if row else 0.0,
        time=now,
        round_id=round_id,
        free_milli=list(row),
        source="simulated",
    )


class RemotePolicy:
    """A `Policy` whose every window is scoring's answer to a round request. With
    `local` (a preemptive policy, under `--preempt`) its `rank` and `next_threshold`,
    pure functions of a job's attained service, decide the simulator's preemptions."""

    oracle = False

    def __init__(self, name: str, time_invariant: bool, rounds: Rounds, local: Any = None) -> None:
        self.name = name
        self.time_invariant = time_invariant
        self.rounds = rounds
        self.local = local
        self.preemptive = bool(getattr(local, "preemptive", False))

    def rank(self, job: QueuedJob, attained_gpu_s: float) -> Any:
        return self.local.rank(job, attained_gpu_s)

    def next_threshold(self, attained_gpu_s: float) -> float | None:
        return self.local.next_threshold(attained_gpu_s)

    @property
    def label(self) -> str:
        return self.name

    def reset(self, ctx: PolicyContext) -> None:
        self.rounds.by_id.clear()

    def add(self, job: QueuedJob) -> None:
        self.rounds.by_id[job.job_id] = job
        if job.job_id == self.rounds.requeue:
            self.rounds.pending.preempted.append(job.job_id)
        else:
            self.rounds.pending.arrived.append(job.job_id)

    def remove(self, job: QueuedJob) -> None:
        self.rounds.by_id.pop(job.job_id, None)
        self.rounds.pending.started.append(job.job_id)

    def window(self, k: int, obs: Observation) -> Iterable[QueuedJob]:
        return self.rounds.score(k, obs.now)


class RemotePlacer:
    """A `Placer` whose every answer is the placement service's, which applies the
    order rule and the discipline itself (`OrdersWindow`)."""

    orders_window = True
    leaves_cycles = False
    cycles = 0

    def __init__(self, name: str, rounds: Rounds) -> None:
        self.name = name  # the placer the service runs: the simulator reads it
        self.rounds = rounds
        rounds.offload_aware = OFFLOAD_SUFFIX in name
        # the simulator checks for moves when this is set (its settings say which running
        # jobs are candidates; placement decides, services/placement/replace.py)
        self.replace = ReplaceConfig() if name.endswith(OFFLOAD_SUFFIX + REPLACE_SUFFIX) else None

    def replacement(
        self,
        running: Sequence[RunningOffload],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        waiting: int = 0,
        queue: QueuePlan | None = None,
    ) -> Move | None:
        """The placement service's move (a `replace` round), or None."""
        return self.rounds.replace(waiting, queue)

    @property
    def fallbacks(self) -> int:
        return self.rounds.fallbacks

    def place(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        ctx: RoundContext | None = None,
    ) -> PlacementResult:
        return self.rounds.place(jobs, ctx)


def bus_simulator(
    cluster: ClusterSpec, policy: RemotePolicy, placer: RemotePlacer, config: SimConfig
) -> Simulator:
    """The simulator, its rounds asked over the bus, telling them of every start and
    finish (`BusEvents`). The placement service wraps its placer in the order rule and
    the discipline (shared.sched.ordered): the simulator asks it, not a wrapper of its
    own (`RemotePlacer.orders_window`).

    Reclaim (shared/sim/reclaim.py) runs here as in `rltune simulate`: the
    simulator alone decides which borrowers stop and when (grace, minimum run,
    checkpoint loss); each stop goes out as a `preempted` event and in the next
    round's `preempted` list, and the reclaiming job's start (placed at once on the
    GPUs its victims freed) is a round of its own (`Rounds._stale`)."""
    sim = Simulator(cluster, policy, placer, config)
    policy.rounds.sim = sim
    sim.observers.append(BusEvents(sim, policy.rounds))
    return sim


class BusEvents(SimObserver):
    """A simulator's starts, moves, preemptions and finishes as the `JobEvent`s, and its
    offloading jobs' rates as the `OffloadStats`, that go out with the next round."""

    def __init__(self, sim: Simulator, rounds: Rounds) -> None:
        self.sim = sim
        self.rounds = rounds

    def _nodes(self, claim: Claim) -> list[str]:
        return [self.sim.state.node_ids[i] for i, _ in claim]

    def started(self, run: Run, now: float) -> None:
        self.rounds.pending.events.append(
            JobEvent(run.job.job_id, "started", now, self._nodes(run.claim), run.nodes)
        )

    def rerated(self, seqs: Set[int], now: float) -> None:
        """Offloading jobs whose rate changed (a job started or stopped on their nodes):
        their figures from the cost model go out on `offload.stats` with the next round,
        as an offload agent's would (the reward's offload terms, in simulation): every
        change, each stamped with its time, so the figures over a job's run can be
        integrated from the topic alone."""
        sim = self.sim
        for seq in sorted(seqs):
            run = sim.runs[seq]
            if run.step is None or not run.claim:
                continue
            cost = run.step
            traffic = sim.offload.demand_of(seq).traffic
            self.rounds.offload.append(OffloadStats(
                job_id=run.job.job_id,
                node_id=sim.state.node_ids[run.claim[0][0]],
                hit_rate=cost.hit_rate,
                # the model gives one mean copy time per rate: no spread to report
                migration_ms_p50=cost.migration_ms,
                migration_ms_p99=cost.migration_ms,
                bytes_in=int(traffic.bytes_moved),  # per GPU and step, both directions
                step_ms=cost.step_ms,
                time=now,
            ))  # fmt: skip

    def moved(self, run: Run, move: Move, now: float, done: bool) -> None:
        """Placement's move, applied as in-process: the new segment goes out as
        `started` (a refused one as `rejected_placement`: the job runs on where it was)."""
        jid = run.job.job_id
        if not done:
            nodes = sorted({n for n, _ in move.alloc.gpus})
            self.rounds.pending.events.append(
                JobEvent(jid, "rejected_placement", now, nodes, "move: GPUs not free")
            )
            return
        self.rounds.pending.events.append(
            JobEvent(jid, "started", now, self._nodes(run.claim), run.nodes)
        )

    def preempting(self, run: Run, now: float) -> None:
        self.rounds.requeue = run.job.job_id  # the policy's `add` is this job's return

    def preempted(self, run: Run, claim: Claim, now: float) -> None:
        self.rounds.requeue = None
        nodes = sorted(set(self._nodes(claim)))
        # detail: why (shared/sim/reclaim.py: "reclaim" or "priority"; "" for LAS)
        ev = JobEvent(run.job.job_id, "preempted", now, nodes, detail=run.why)
        self.rounds.pending.events.append(ev)

    def finished(self, run: Run, claim: Claim, now: float) -> None:
        nodes = sorted(set(self._nodes(claim)))
        self.rounds.pending.finished.append(run.job.job_id)
        if run.timed_out:  # stopped at its time limit: as a host agent reports it
            limit = f"time limit of {run.job.time_limit_s or 0.0:g} s reached"
            ev = JobEvent(run.job.job_id, "failed", now, nodes, detail=limit)
        else:
            ev = JobEvent(run.job.job_id, "finished", now, nodes)
        self.rounds.pending.events.append(ev)
