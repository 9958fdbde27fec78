"""Offloading jobs' progress in the simulator: rates that change with who streams
on their nodes.

An offloading job runs at its step cost's slowdown (offload_state.py, from the jobs
that share its nodes' links). Whenever that changes (a job starts, stops or moves
next to it), its progress so far is credited at the old rate (`bank`), it gets the
new one, and its finish is moved (`rerate`): a fresh finish event, the old one
recognised as stale by its time (`Run.finish_at`).
"""

from __future__ import annotations

import heapq
from collections.abc import Set

from shared.sim.observer import SimObserver
from shared.sim.offload_state import OffloadState
from shared.sim.run import Run

__all__ = ["FINISH_EVENT", "OffloadRates"]

FINISH_EVENT = 0  # the engine's event kind of a job's finish


class OffloadRates:
    def __init__(
        self,
        offload: OffloadState,
        runs: list[Run],
        events: list[tuple[float, int, int, int]],
        observers: list[SimObserver],
        ref_speed: float,
    ) -> None:
        self.offload, self.runs, self.events = offload, runs, events
        self.observers, self.ref_speed = observers, ref_speed

    def bank(self, run: Run, now: float) -> None:
        """Credit an offloading job's progress since its last rate change."""
        dt = now - run.mark
        if dt > 0:
            # restoring a moved job's checkpoint: GPUs held, no progress, no migrations
            busy = min(max(run.restart_until - run.mark, 0.0), dt)
            work = dt - busy
            run.work -= work * run.speed / (self.ref_speed * run.factor)
            run.seg_unhidden += work * (1.0 - 1.0 / run.factor)
            rec = run.offload
            assert rec is not None
            cost = run.step
            assert cost is not None
            rec.run_s += dt
            rec.unhidden_s += work * (1.0 - 1.0 / run.factor)
            rec.hits_weighted += dt * cost.hit_rate
            rec.latency_weighted += dt * cost.migration_ms
            steps = dt * 1e3 / cost.step_ms if cost.step_ms > 0 else 0.0
            rec.bytes_moved += steps * self.offload.demand_of(run.job.seq).traffic.bytes_moved
        run.mark = now

    def rerate(self, seqs: Set[int], now: float) -> None:
        """New slowdowns for the offloading jobs in `seqs` (all running), finish moved."""
        for seq in sorted(seqs):
            run = self.runs[seq]
            self.bank(run, now)
            run.step = self.offload.step(seq)
            run.factor = run.step.slowdown
            assert run.offload is not None
            run.offload.slowdowns.append(run.factor)
            begin = max(now, run.restart_until)  # a moved job restores its checkpoint first
            run.finish_at = begin + max(run.work, 0.0) * self.ref_speed * run.factor / run.speed
            heapq.heappush(self.events, (run.finish_at, FINISH_EVENT, seq, run.epoch))
        for o in self.observers:
            o.rerated(seqs, now)
