"""Building blocks the baseline policies share: a sorted waiting queue, and the
two ways of keeping it (one static key per job; FIFO groups ranked each round).

Both keep every operation cheap with thousands of waiting jobs: a static key is
bisected into a list once, a group's FIFO order never changes, and a window is
read off the front instead of sorting the whole queue each round.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Hashable, Iterator
from itertools import islice
from operator import itemgetter
from typing import Any

from shared.policy_api import Observation, OracleContext, PolicyContext, QueuedJob

__all__ = ["GroupedPolicy", "OracleKeyPolicy", "PolicyBase", "SortedQueue", "StaticKeyPolicy"]

Key = tuple[float, ...]  # always ends with the job's seq, so keys are unique


class SortedQueue:
    """Jobs sorted by key; insert/delete bisect a plain list (a memmove at C speed)."""

    __slots__ = ("_jobs", "_keys")

    def __init__(self) -> None:
        self._keys: list[Key] = []
        self._jobs: dict[int, QueuedJob] = {}

    def add(self, key: Key, job: QueuedJob) -> None:
        if not self._keys or key > self._keys[-1]:
            self._keys.append(key)
        else:
            insort(self._keys, key)
        self._jobs[job.seq] = job

    def remove(self, key: Key) -> None:
        del self._keys[bisect_left(self._keys, key)]
        del self._jobs[key[-1]]  # type: ignore[arg-type]

    def head(self, k: int) -> Iterator[QueuedJob]:
        """The first `k` jobs, lazily (a round often reads only a few)."""
        jobs = self._jobs
        return (jobs[key[-1]] for key in islice(self._keys, k))  # type: ignore[index]

    def first_key(self) -> Key:
        return self._keys[0]

    def keyed(self) -> Iterator[tuple[Key, QueuedJob]]:
        jobs = self._jobs
        return ((key, jobs[key[-1]]) for key in self._keys)  # type: ignore[index]

    def __len__(self) -> int:
        return len(self._keys)


class PolicyBase:
    """What every baseline shares: its name, label and flags, and the run's context."""

    name = ""
    oracle = False
    time_invariant = True
    preemptive = False

    @property
    def label(self) -> str:
        return f"{self.name} (oracle)" if self.oracle else self.name

    def reset(self, ctx: PolicyContext) -> None:
        self.ctx = ctx


class StaticKeyPolicy(PolicyBase):
    """Order = a key fixed when the job joins the queue (`key(job)`, ending with seq)."""

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._queue = SortedQueue()
        self._key_of: dict[int, Key] = {}

    def key(self, job: QueuedJob) -> Key:
        raise NotImplementedError

    def add(self, job: QueuedJob) -> None:
        key = self.key(job)
        self._key_of[job.seq] = key
        self._queue.add(key, job)

    def remove(self, job: QueuedJob) -> None:
        self._queue.remove(self._key_of.pop(job.seq))

    def window(self, k: int, obs: Observation) -> Iterator[QueuedJob]:
        return self._queue.head(k)


class OracleKeyPolicy(StaticKeyPolicy):
    """A static key from the jobs' true run times (`self.run_s(job)`): an ORACLE, reset
    only with an `OracleContext` (shown as "NAME (oracle)" everywhere)."""

    oracle = True

    def reset(self, ctx: PolicyContext) -> None:
        if not isinstance(ctx, OracleContext):
            raise ValueError(f"{self.name} needs the true run times (an OracleContext)")
        super().reset(ctx)
        self.run_s = ctx.true_run_s


class GroupedPolicy(PolicyBase):
    """Jobs in groups, each in FIFO order (submit, seq); the order across groups is
    recomputed each round from what the policy has learned.

    Fast case, `group_rank(gid, obs)` returns a number (or a tuple of numbers): the
    order is (rank, submit,
    seq), read off group by group. Otherwise `job_key(job, obs)` must be monotone
    in FIFO order within a group, and the groups are merged on it.
    """

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._groups: dict[Hashable, SortedQueue] = {}
        self._gid: dict[int, Hashable] = {}

    def group_of(self, job: QueuedJob) -> Hashable:
        raise NotImplementedError

    def group_rank(self, gid: Hashable, obs: Observation) -> float | tuple[float, ...] | None:
        return None

    def job_key(self, job: QueuedJob, obs: Observation) -> Key:
        raise NotImplementedError

    def add(self, job: QueuedJob) -> None:
        gid = self.group_of(job)
        self._gid[job.seq] = gid
        q = self._groups.get(gid)
        if q is None:
            q = self._groups[gid] = SortedQueue()
        q.add((job.submit_s, job.seq), job)

    def remove(self, job: QueuedJob) -> None:
        gid = self._gid.pop(job.seq)
        q = self._groups[gid]
        q.remove((job.submit_s, job.seq))
        if not len(q):
            del self._groups[gid]

    def window(self, k: int, obs: Observation) -> Iterator[QueuedJob]:
        groups = self._groups
        if not groups:
            return iter(())
        rank = self.group_rank
        ranked = [(rank(g, obs), q.first_key(), n, q) for n, (g, q) in enumerate(groups.items())]
        if ranked[0][0] is None:
            return self._merged(k, obs)
        ranked.sort()
        return islice(self._by_rank(ranked), k)

    @staticmethod
    def _by_rank(ranked: list[tuple[Any, Key, int, SortedQueue]]) -> Iterator[QueuedJob]:
        i, n = 0, len(ranked)
        while i < n:
            j = i + 1
            while j < n and ranked[j][0] == ranked[i][0]:
                j += 1
            if j == i + 1:
                q = ranked[i][3]
                yield from q.head(len(q))
            else:  # equal ranks: FIFO across the tied groups
                tied = heapq.merge(*(r[3].keyed() for r in ranked[i:j]), key=itemgetter(0))
                for _, job in tied:
                    yield job
            i = j

    def _merged(self, k: int, obs: Observation) -> Iterator[QueuedJob]:
        key = self.job_key
        streams = [((key(job, obs), job) for _, job in q.keyed()) for q in self._groups.values()]
        return (job for _, job in islice(heapq.merge(*streams, key=itemgetter(0)), k))
