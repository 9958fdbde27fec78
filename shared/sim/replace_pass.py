"""The re-placement pass: running offloading jobs moved onto better GPUs.

On when the placer declares `Replacing` (an offload-aware placer with re-placement
on, or the bus executor's remote placer; the decision itself is
services/placement/replace.py's). After a round (waiting jobs had the free GPUs
first), at every finish and at least every hour of virtual time, the pass lists
the running offloading jobs that may move (`_movable`), reads the queue check's
inputs (`_queue_plan`), and asks the placer for one move at a time, each decided
on the state the previous one left; the simulator carries a move out
(`Simulator.move`: the job checkpointed, its GPUs freed, restarted on the new ones
with the restore charged there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import islice
from typing import Protocol

from shared.placement_api import FULL_GPU, JobRequest, Release
from shared.policy_api import QueuedJob
from shared.sched.replacement import (
    Move,
    QueuePlan,
    ReplaceConfig,
    Replacing,
    RunningOffload,
)
from shared.sim.observe import WaitingIndex
from shared.sim.offload_state import OffloadState
from shared.sim.run import Run
from shared.sim.state import ClusterState

__all__ = ["REPLACE_EVERY_S", "ReplaceHost", "ReplacePass"]

REPLACE_EVERY_S = 3600.0  # re-placement is checked at every finish and at least this often
_MOVES_PER_CHECK = 8


class ReplaceHost(Protocol):
    """What the pass reads and calls of the simulator it serves."""

    runs: list[Run]
    state: ClusterState
    offload: OffloadState
    waiting: WaitingIndex
    speed: dict[str, float]

    def move(self, run: Run, move: Move, now: float) -> bool:
        """Carry `move` out; whether it was (its GPUs were free)."""


class ReplacePass:
    def __init__(
        self,
        sim: ReplaceHost,
        placer: Replacing,
        cfg: ReplaceConfig,
        releases: Mapping[int, Release],
        estimate_of: Callable[[QueuedJob], float],
        easy: bool,
    ) -> None:
        self.sim, self.placer, self.cfg = sim, placer, cfg
        self.releases, self.estimate_of, self.easy = releases, estimate_of, easy
        # waiting jobs in arrival order, for the queue check (replace.py)
        self.fifo: dict[int, QueuedJob] | None = {} if self.cfg.queue_check != "off" else None
        self.next_at = 0.0  # the latest time of the next check

    def enqueued(self, job: QueuedJob) -> None:
        if self.fifo is not None:
            self.fifo[job.seq] = job

    def dequeued(self, seq: int) -> None:
        if self.fifo is not None:
            self.fifo.pop(seq, None)

    def run(self, now: float) -> None:
        """Move running offloading jobs the placer finds worth moving onto the free GPUs
        (after the round: waiting jobs had them first), one at a time, each decided on
        the state the previous one left."""
        sim, cfg = self.sim, self.cfg
        self.next_at = now + REPLACE_EVERY_S
        for _ in range(_MOVES_PER_CHECK):
            cands = self._movable(now, cfg)
            if not cands:
                return
            free = sim.state.free_nodes()
            queue = self._queue_plan(now, cfg) if self.fifo is not None else None
            move = self.placer.replacement(cands, free, sim.speed, sim.waiting.count, queue)
            if move is None:
                return
            if not sim.move(sim.runs[sim.offload.by_id[move.job_id]], move, now):
                return

    def _queue_plan(self, now: float, cfg: ReplaceConfig) -> QueuePlan | None:
        """What re-placement's queue check reads (replace.py): the first waiting jobs in
        arrival order with their estimates, and every running job's expected end
        (start + estimate; past it, now + expect x its run time so far). Under EASY
        only (the running jobs' estimates are its releases)."""
        assert self.fifo is not None
        if not self.easy:
            return None
        running = []
        for seq, rel in self.releases.items():
            run = self.sim.runs[seq]
            end = rel.time_s
            if end <= now:
                elapsed = sum(s.finish_s - s.start_s for s in run.segments) + now - run.seg_start
                end = now + cfg.expect * elapsed
            g = run.job.num_gpus if run.job.gpu_milli >= FULL_GPU else 0
            running.append((run.job.job_id, end, g))
        waiting = [
            (j.job_id, j.num_gpus, self.estimate_of(j))
            for j in islice(self.fifo.values(), cfg.queue_window)
        ]
        return QueuePlan(now, self.sim.state.whole_total, running, waiting)

    def _movable(self, now: float, cfg: ReplaceConfig) -> list[RunningOffload]:
        sim = self.sim
        st, off, out = sim.state, sim.offload, []
        for seq in off.placed:
            run = sim.runs[seq]
            job = run.job
            elapsed = sum(s.finish_s - s.start_s for s in run.segments) + now - run.seg_start
            if elapsed < max(cfg.min_run_s, cfg.after * run.est) or now < run.restart_until:
                continue
            req = JobRequest(job.job_id, job.num_gpus, job.gpu_milli, job.gpu_types, job.weight)
            out.append(
                RunningOffload(
                    req, off.param_bytes[seq], elapsed, run.est, run.factor, run.speed,
                    off.relief(seq), frozenset(st.node_ids[i] for i, _ in run.claim),
                    now - run.seg_start if run.seg_restart > 0 else None,  # moved: since when
                )
            )  # fmt: skip
        return out
