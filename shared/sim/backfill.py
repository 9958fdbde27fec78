"""Which waiting jobs a round hands the placer, and EASY backfill's bookkeeping.

The simulator (engine.py) owns one `Backfill`. It keeps the running jobs' expected
releases (start + history estimate) in time order, the head of the last round's
window, the run-time estimates between two finishes and the window's last
requests; from those it builds each round's candidates (`candidates`: the window
jobs that could start, in order, stopping once nothing more can fit), their
`JobRequest`s, and the `RoundContext` that EASY's reservation reads
(shared/sched/reservation.py).

Under `easy`, a round leaves out the jobs behind the head that the head's
reservation refuses whatever else starts (`_reservation`): most of a loaded
window, every round.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from shared.placement_api import FULL_GPU, Allocation, JobRequest, Release, RoundContext
from shared.policy_api import History, Policy, QueuedJob
from shared.sim.observe import SimObservation
from shared.sim.state import ClusterState

__all__ = ["Backfill"]


class Backfill:
    def __init__(
        self,
        state: ClusterState,
        policy: Policy,
        obs: SimObservation,
        history: History,
        *,
        window: int,
        discipline: str,
        node_type: Mapping[str, str],
        queue_allows: Callable[[QueuedJob], bool],
        has_limits: bool,
    ) -> None:
        self.state, self.policy, self.obs, self.history = state, policy, obs, history
        self.window, self.discipline, self.node_type = window, discipline, node_type
        self.queue_allows, self.has_limits = queue_allows, has_limits
        self.easy = discipline == "easy"
        # running jobs' (start + estimate, seq) in order, and their releases (EASY)
        self.release_keys: list[tuple[float, int]] = []
        self.releases: dict[int, Release] = {}
        self.head_id: str | None = None  # the head of the last round's window (EASY)
        self._reqs: dict[int, JobRequest] = {}  # waiting job -> its last window request
        # (who, GPUs, requested time) -> estimate until a finish
        self._est: dict[tuple[str, int, float | None], float] = {}

    # ---- the running jobs' expected releases ---------------------------------------
    def started(self, job: QueuedJob, alloc: Allocation, now: float) -> None:
        """`job` left the queue on `alloc`: under EASY, its expected release."""
        if self.easy:
            end = now + self.history.estimate(job)
            self.releases[job.seq] = Release(end, alloc)
            insort(self.release_keys, (end, job.seq))
        self._reqs.pop(job.seq, None)

    def stopped(self, seq: int) -> None:
        """A running job gave its GPUs back: its release is gone."""
        rel = self.releases.pop(seq, None)
        if rel is not None:
            del self.release_keys[bisect_left(self.release_keys, (rel.time_s, seq))]

    def restore(self, seq: int, rel: Release | None, alloc: Allocation) -> None:
        """A moved job keeps the release it had (`rel`, None if none), on its new GPUs."""
        if rel is not None:
            self.releases[seq] = Release(rel.time_s, alloc)
            insort(self.release_keys, (rel.time_s, seq))

    def finished(self) -> None:
        """A job finished: estimates learn from every finish."""
        self._est.clear()

    def context(self, now: float) -> RoundContext | None:
        """Running jobs' expected releases, for EASY's reservation."""
        if not self.easy:
            return None
        return RoundContext(now, _Releases(self.release_keys, self.releases), self.node_type)

    def estimate(self, j: QueuedJob) -> float:
        """History's run-time estimate of `j`, once per (user, size, request) between
        finishes."""
        key = (j.user or j.vc, j.num_gpus, j.time_limit_s)  # QueuedJob.who, inline
        e = self._est.get(key)
        if e is None:
            e = self._est[key] = self.history.estimate(j)
        return e

    # ---- one round's window -----------------------------------------------------------
    def requests(self, cands: Sequence[QueuedJob]) -> list[JobRequest]:
        """The round's candidates as JobRequests in window order, scored by rank (the
        first gets the window size K, the next K - 1, ...), with run-time estimates from
        history under EASY. A job's request is made again only when its rank or its
        estimate changed since the last round it was in."""
        k = self.window
        cache, easy = self._reqs, self.easy
        out = []
        for r, j in enumerate(cands):
            e = self.estimate(j) if easy else 0.0
            score = float(k - r)
            req = cache.get(j.seq)
            if req is None or req.score != score or req.est_run_s != e:
                req = cache[j.seq] = JobRequest(
                    j.job_id, j.num_gpus, j.gpu_milli, j.gpu_types, j.weight, score, e
                )
            out.append(req)
        return out

    def new_head(self) -> bool:
        """Under EASY, whether arrivals put a new job first in the policy's order (its
        reservation differs, so jobs refused for the old one may fit now). After a
        round, every job ahead of its head has started, so the head was first."""
        first = next(iter(self.policy.window(1, self.obs)), None)
        return first is not None and first.job_id != self.head_id

    def candidates(self) -> list[QueuedJob]:
        """The window jobs that could start, in order; stops once nothing more can fit.

        Under `strict` the scan stops at the first job that cannot start (nothing
        passes it); under `easy` that first one is kept (the head, for its
        reservation) and the scan goes on for jobs that fit.

        Each could fit the free GPUs alone. With an in-order first-fit placer, and
        as long as only untyped whole-GPU jobs were taken, `budget` is exactly the
        whole GPUs the placer will have left, so a job that needs more is dropped
        (the placer would skip it) and the scan ends when none is left: a round
        costs what it starts, not the window size. After a typed or sharing job,
        `budget` stops shrinking and is only an upper bound, which is still safe.
        """
        st = self.state
        fits, limits = st.fits, self.has_limits
        budget, exact = st.whole_total, True
        strict = self.discipline == "strict"
        head = not self.easy  # under easy: the head is still to be found
        # under easy, once the head is an untyped whole-GPU job behind exactly counted
        # ones: its reservation time, the GPUs spare at it, and whether `budget` and
        # `spare` still count exactly what the backfills kept so far leave (they do
        # while every kept one is an untyped whole-GPU job; after that, upper bounds)
        reserved, at, spare, tracked = False, 0.0, 0, False
        now = self.obs.now
        out = []
        for j in self.policy.window(self.window, self.obs):
            if limits and not self.queue_allows(j):
                continue
            typed_or_share = bool(j.gpu_types) or (j.gpu_milli < FULL_GPU and j.num_gpus == 1)
            if typed_or_share:
                ok = fits(j.num_gpus, j.gpu_milli, j.gpu_types)
                exact = False
            else:
                ok = j.num_gpus <= budget
                if ok and exact:
                    budget -= j.num_gpus
            if ok and reserved and j.gpu_milli >= FULL_GPU:
                # a backfill: EASY refuses it if it runs past the reservation on GPUs
                # the head needs (the spare GPUs only shrink), else starts it if it fits
                late = now + self.estimate(j) > at
                if late and j.num_gpus > spare:
                    continue
                if tracked and not typed_or_share:
                    budget -= j.num_gpus
                    spare -= j.num_gpus if late else 0
            if ok:
                out.append(j)
                tracked &= not typed_or_share
            elif strict:
                break  # nothing passes a job that cannot start
            elif not head:
                if exact and not j.gpu_types and j.gpu_milli >= FULL_GPU:
                    got = self._reservation(j, out, budget)
                    if got is not None:
                        (at, spare), reserved, tracked = got, True, True
                out.append(j)
                head = True
                exact = False  # a backfill refused for the reservation takes nothing
            if budget <= 0 and not st.partial and head:
                break  # no whole GPU left for anyone, no shared GPU with room
        return out

    def _reservation(
        self, head: QueuedJob, ahead: Sequence[QueuedJob], whole: int
    ) -> tuple[float, int] | None:
        """The reservation EASY will give `head`, an untyped whole-GPU job, when every
        job `ahead` of it starts (untyped whole-GPU jobs that `whole`, the whole free
        GPUs left after them, counts exactly): the time its GPUs come back and how many
        whole GPUs beyond its own are expected free then. The same walk as
        shared.sched.reservation (running jobs' releases and the jobs ahead at
        now + estimate, in time order, ties alike) on counts. A job behind the head
        that ends after that time and needs more than the spare GPUs is refused there
        whatever else starts (the spare only shrinks), so the round need not carry it.
        None: no reservation (its GPUs never come back) or a share is released first."""
        now = self.obs.now
        mine = sorted(((now + self.estimate(a), a.num_gpus) for a in ahead), key=_first)
        theirs = (
            (max(r.time_s, now), sum(len(g) for _, g in r.alloc.gpus))
            if r.alloc.gpu_milli >= FULL_GPU
            else (max(r.time_s, now), -1)
            for r in _Releases(self.release_keys, self.releases)
        )
        for t, gpus in heapq.merge(theirs, mine, key=_first):
            if gpus < 0:
                return None
            whole += gpus
            if whole >= head.num_gpus:
                return t, whole - head.num_gpus
        return None


def _first(e: tuple[float, int]) -> float:
    return e[0]


class _Releases(Collection[Release]):
    """The running jobs' releases in time order, read lazily (a reservation stops at
    the first time the head fits; most rounds read a few of hundreds)."""

    def __init__(self, keys: list[tuple[float, int]], releases: dict[int, Release]) -> None:
        self._keys, self._releases = keys, releases

    def __iter__(self) -> Iterator[Release]:
        rel = self._releases
        return (rel[seq] for _, seq in self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, item: object) -> bool:
        return any(r == item for r in self)
