"""The turn a job would get under EASY `fifo`, from what a policy may see.

`FifoShadow` replays the jobs a policy has been handed (`add`, in arrival order)
through EASY FIFO on a cluster of `total` GPUs counted as one pool, with run times
estimated from history (`History.estimate`, the same estimate EASY's backfill
reserves with): jobs start in submit order while they fit; when the head does not
fit it gets a reservation at the earliest estimated release that frees enough GPUs,
and a later job among the first `window` starts now if it fits and its estimate ends
by the reservation or it fits in the GPUs spare at it. A job's *turn* is the first
shadow time at which it is the head of that queue (the job EASY reserves for) or
starts, whichever comes first.

`RLPolicy`'s `bound_scale="fifo"` puts a large job ahead of the network once its turn
has come, so it gets the reservation no later than EASY `fifo` would give it, as far
as the estimates tell: the wait bound read from `fifo`'s order instead of a
constant. It reads no true run time: the shadow's run times are estimates from
finished jobs (`Observation.history`), its arrivals the `QueuedJob`s the policy was
handed. What it ignores: GPU types, nodes and shares (one pool of `total` GPUs),
and the real cluster's running jobs when the policy is first reset onto a loaded
cluster (the shadow then starts empty, so turns come early, on the safe side).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from shared.policy_api import QueuedJob

__all__ = ["FifoShadow"]

_EPS = 1e-9


class FifoShadow:
    """EASY FIFO over estimated run times, advanced lazily to each round's clock."""

    __slots__ = (
        "_arrivals", "_gone", "_head", "_queue", "_running", "_turn", "free", "t", "total",
        "window",
    )  # fmt: skip

    def __init__(self, window: int = 128) -> None:
        self.window = window
        self.total: float | None = None  # GPUs, set on the first advance
        self.free = 0.0
        self.t = float("-inf")  # the shadow's clock
        self._arrivals: list[QueuedJob] = []  # handed, not yet in the shadow queue
        self._queue: dict[int, QueuedJob] = {}  # shadow-waiting, FIFO (arrival order)
        self._running: list[tuple[float, int, float]] = []  # heap of (end, seq, gpus)
        self._turn: dict[int, float] = {}  # seq -> turn, for jobs still waiting for real
        self._gone: set[int] = set()  # left the real queue before their turn came
        self._head = -1  # the seq of the head whose turn has been marked

    def add(self, job: QueuedJob) -> None:
        self._arrivals.append(job)

    def forget(self, seq: int) -> None:
        """The job left the real queue: drop its turn (the shadow still runs it)."""
        if self._turn.pop(seq, None) is None:
            self._gone.add(seq)

    def turn(self, seq: int) -> float | None:
        """When `seq` became the head of the shadow queue or started there (None: not yet)."""
        return self._turn.get(seq)

    def advance(self, now: float, total: float, estimate: Callable[[QueuedJob], float]) -> None:
        """Run the shadow up to `now` on `total` GPUs, estimating run times with `estimate`."""
        if self.total is None:
            self.total = self.free = float(total)
        arrivals = self._arrivals
        arrivals.sort(key=_age)
        i = 0
        while True:
            next_arrival = max(arrivals[i].submit_s, self.t) if i < len(arrivals) else None
            next_end = self._running[0][0] if self._running else None
            at = min(x for x in (next_arrival, next_end, float("inf")) if x is not None)
            if at > now:
                break
            self.t = at
            while self._running and self._running[0][0] <= at:
                self.free += heapq.heappop(self._running)[2]
            while i < len(arrivals) and arrivals[i].submit_s <= at:
                self._queue[arrivals[i].seq] = arrivals[i]
                i += 1
            self._schedule(estimate)
        del arrivals[:i]
        self.t = max(self.t, now)

    def _start(self, job: QueuedJob, est: float) -> None:
        del self._queue[job.seq]
        self.free -= job.gpus
        heapq.heappush(self._running, (self.t + est, job.seq, job.gpus))
        if job.seq != self._head:
            self._mark(job)

    def _mark(self, job: QueuedJob) -> None:
        """`job`'s turn is now (called once per job: when it is first the head, or
        when it starts without having been the head)."""
        if job.seq in self._gone:
            self._gone.discard(job.seq)
        else:
            self._turn[job.seq] = self.t

    def _schedule(self, estimate: Callable[[QueuedJob], float]) -> None:
        assert self.total is not None
        while self._queue:
            head = next(iter(self._queue.values()))
            if head.gpus > self.total + _EPS:  # never fits: not a head anyone waits behind
                del self._queue[head.seq]
                if head.seq != self._head:
                    self._mark(head)
                continue
            if head.gpus <= self.free + _EPS:
                self._start(head, estimate(head))
                continue
            break
        if not self._queue:
            return
        head = next(iter(self._queue.values()))
        if head.seq != self._head:
            self._head = head.seq
            self._mark(head)
        reserved: tuple[float, float] | None = None  # (time, GPUs spare then), when needed
        for job in list(itertools.islice(self._queue.values(), 1, self.window)):
            if job.gpus > self.free + _EPS:
                continue
            if reserved is None:
                reserved = self._reservation(head.gpus)
            at, spare = reserved
            est = estimate(job)
            if self.t + est <= at:
                self._start(job, est)
            elif job.gpus <= spare + _EPS:
                self._start(job, est)
                reserved = (at, spare - job.gpus)

    def _reservation(self, gpus: float) -> tuple[float, float]:
        """(when `gpus` GPUs are free by the estimated releases, GPUs spare then)."""
        free = self.free
        for end, _, g in sorted(self._running):
            free += g
            if free + _EPS >= gpus:
                return end, free - gpus
        return float("inf"), 0.0


def _age(job: QueuedJob) -> tuple[float, int]:
    return job.submit_s, job.seq
