"""Re-placement in the placement service (pure: no bus): which running offloading job to
move, and where, issued as `PlacementBatch.moves`.

The decision is the simulator's (replace.py through OffloadAwarePlacer.replacement);
what the service adds is a view of the running offloading jobs the simulator keeps
for itself:

* which jobs offload and how large they are: `jobs.accepted` (`Job.offload.param_bytes`);
  their run-time estimate is the job's `duration_hint_s` (none: 0, so a job is a
  candidate once it has run `min_run_s`);
* where each runs and since when: the GPUs this service gave it (its own
  `PlacementBatch`, or a move it issued) once the executor reports it `started`
  (the event's time), until `finished`, `failed` or `preempted`;
* how slow each is where it runs and would be elsewhere: the simulator's cost model
  (shared.sim.offload_state.OffloadState) over the cluster spec's nodes (their PCIe and
  NVMe GB/s and host memory), so the service needs `--cluster`. It is the model's
  estimate, not the offload agents' measurements (`offload.stats`).

As in the simulator, a moved job counts on its new nodes from the decision on (so the
next decision sees it there); the executor's `started` event for the move dates its
new segment, a `rejected_placement` puts it back where it was. A job with a move
issued and not yet confirmed is not a candidate again, and a moved job stays
`settle_s` (ReplaceConfig). The new GPUs are taken off the free view at once, the
old ones come back with the executor's next `NodeStatus`, as for any placement.
After a restart of the service, jobs that started before it are not tracked (their
GPUs are not known from the events alone) and are never moved in free rounds.

Driven rounds (the simulated executor, cluster_sim) do not depend on the events: each
place and replace request carries the executor's running offloading jobs
(`RoundRequest.offloading`), and `load` rebuilds the view from them before the solve,
so the offload view is the executor's whatever order the topics are read in, after a
restart too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from shared.cluster import ClusterSpec
from shared.messages import Job, JobEvent, OffloadRunning, OffloadSpec
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree
from shared.sched.replacement import Move, QueuePlan, RunningOffload
from shared.sim.offload_state import OffloadState

__all__ = ["RunningOffloads"]


@dataclass
class _Running:
    seq: int
    alloc: Allocation
    start_s: float  # its current segment's start (the executor's `started` time)
    before_s: float  # run time of its earlier segments
    moved: bool  # its current segment began with a move
    # driven rounds: the executor's figures, as it states them (exact: no clock arithmetic)
    given: OffloadRunning | None = None


class RunningOffloads:
    """The service's view of the offloading jobs: accepted, given GPUs, running."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.state = OffloadState(cluster)
        self.jobs: dict[str, Job] = {}  # offloading jobs by id
        self.given: dict[str, Allocation] = {}  # placed by this service, not started yet
        self.running: dict[str, _Running] = {}
        # moves issued and not yet confirmed (`started`) or refused: the segment before
        self.moving: dict[str, _Running] = {}
        self.done_s: dict[str, float] = {}  # run time of a job's finished segments
        self.node_of = {n.node_id: i for i, n in enumerate(cluster.nodes)}

    def accepted(self, job: Job) -> None:
        pb = job.offload.param_bytes if job.offload is not None else 0
        if pb > 0 and job.job_id not in self.jobs:
            self.jobs[job.job_id] = job
            self.state.add_job(len(self.jobs) - 1, job.job_id, pb, job.num_gpus)

    def load(self, now: float, running: list[OffloadRunning], jobs: Mapping[str, Job]) -> None:
        """Replace the view of the running offloading jobs by the executor's (driven
        rounds); `jobs` the accepted jobs (their allowed types and weight)."""
        for jid in list(self.running):
            self._stop(jid, now)
        self.given.clear()
        self.moving.clear()
        for r in running:
            if r.job_id not in self.jobs:  # marked by the executor, not by its submitter
                job = jobs.get(r.job_id) or Job(r.job_id, r.num_gpus, 0.0)
                self.accepted(
                    msgspec.structs.replace(job, offload=OffloadSpec(param_bytes=r.param_bytes))
                )
            alloc = Allocation(
                r.job_id, tuple((n, tuple(g)) for n, g in r.gpus), self.jobs[r.job_id].gpu_milli
            )
            seg = r.moved_s if r.moved_s is not None else 0.0
            self._start(r.job_id, alloc, now - seg, r.elapsed_s - seg, r.moved_s is not None)
            if r.job_id in self.running:
                self.running[r.job_id].given = r

    def given_gpus(self, alloc: Allocation) -> None:
        """This service gave `alloc` in a round's placement."""
        if alloc.job_id in self.jobs:
            self.given[alloc.job_id] = alloc

    def event(self, ev: JobEvent) -> None:
        jid = ev.job_id
        if jid not in self.jobs:
            return
        if ev.kind == "started":
            old = self.moving.pop(jid, None)
            if old is not None:  # the move's new segment: counted from the executor's time
                self.running[jid].start_s = ev.time
                self.running[jid].before_s = old.before_s + max(ev.time - old.start_s, 0.0)
                return
            alloc = self.given.pop(jid, None)
            if alloc is not None:
                self._start(jid, alloc, ev.time, self.done_s.get(jid, 0.0), moved=False)
        elif ev.kind == "rejected_placement" and jid in self.moving:
            # the executor refused the move: the job runs on where it was
            old = self.moving.pop(jid)
            self._stop(jid, ev.time)
            self.running[jid] = old
            self.state.start(old.seq, self._parts(old.alloc))
        elif ev.kind == "rejected_placement":
            self.given.pop(jid, None)  # a placement refused (a running job's: stale, ignored)
        elif ev.kind in ("finished", "failed", "preempted"):
            self.given.pop(jid, None)
            self.moving.pop(jid, None)
            r = self._stop(jid, ev.time)
            if r is not None:
                self.done_s[jid] = r.before_s + max(ev.time - r.start_s, 0.0)

    def _parts(self, alloc: Allocation) -> list[tuple[int, int]]:
        return [(self.node_of[n], len(g)) for n, g in alloc.gpus if n in self.node_of]

    def _start(self, jid: str, alloc: Allocation, now: float, before: float, moved: bool) -> None:
        parts = self._parts(alloc)
        if not parts:
            return  # on nodes the cluster spec does not name: no estimate there
        seq = self.state.by_id[jid]
        self.state.start(seq, parts)
        self.running[jid] = _Running(seq, alloc, now, before, moved)

    def _stop(self, jid: str, now: float) -> _Running | None:
        r = self.running.pop(jid, None)
        if r is not None:
            self.state.stop(r.seq)
        return r

    def candidates(self, now: float, speed: Mapping[str, float]) -> list[RunningOffload]:
        """The running offloading jobs as replace.choose_move sees them (a job with a
        move issued and not yet started again is left out); `speed` by GPU type, as the
        placer gets it."""
        out = []
        st = self.state
        for jid, r in sorted(self.running.items()):
            g = r.given
            if jid in self.moving or (g is not None and g.restoring):
                continue
            job = self.jobs[jid]
            milli = job.gpu_milli if job.num_gpus == 1 else FULL_GPU
            req = JobRequest(jid, job.num_gpus, milli, frozenset(job.gpu_types), job.weight)
            step = st.step(r.seq)
            slowest = min(speed.get(st.nodes[i].gpu_type, 1.0) for i in st.placed[r.seq])
            out.append(
                RunningOffload(
                    req, st.param_bytes[r.seq], r.before_s + max(now - r.start_s, 0.0),
                    job.duration_hint_s or 0.0, step.slowdown, slowest, st.relief(r.seq),
                    frozenset(n for n, _ in r.alloc.gpus),
                    max(now - r.start_s, 0.0) if r.moved else None,
                )
                if g is None
                else RunningOffload(
                    req, st.param_bytes[r.seq], g.elapsed_s, g.est_run_s, step.slowdown, slowest,
                    st.relief(r.seq), frozenset(n for n, _ in r.alloc.gpus), g.moved_s,
                )
            )  # fmt: skip
        return out

    def move(
        self,
        placer: object,
        now: float,
        free: list[NodeFree],
        speed: Mapping[str, float],
        waiting: int = 0,
        queue: QueuePlan | None = None,
    ) -> Move | None:
        """The placer's move (OffloadAwarePlacer.replacement) on `free`, or None; the job
        is then given the move's GPUs (started there when the executor says so)."""
        replacement = getattr(placer, "replacement", None)
        if replacement is None:
            return None
        cands = self.candidates(now, speed)
        if not cands:
            return None
        mv: Move | None = replacement(cands, free, speed, waiting, queue)
        if mv is not None:  # as the simulator does: the job leaves its nodes at the decision
            old = self._stop(mv.job_id, now)
            assert old is not None
            self.moving[mv.job_id] = old
            before = old.before_s + max(now - old.start_s, 0.0)
            self._start(mv.job_id, mv.alloc, now, before, moved=True)
        return mv
