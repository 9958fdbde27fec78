"""Greedy placement in priority order: the fallback, the MILP's warm start, the
sequential rule that decides which window jobs start (ordered.py), and the placer
the simulator uses when no solver is asked for (services/placement/greedy.py wraps
it as a `Placer`).

For each job in window order (most urgent first), GPU types are tried fastest
first (ties by type name), and within a type:
  * a sharing job (gpu_milli < 1000) goes on the already-shared GPU with the least
    free share that holds it (best fit), else on a whole free GPU of the node with
    the fewest whole free GPUs (whole GPUs on emptier nodes stay whole);
  * a whole-GPU job goes on the node with the fewest whole free GPUs that holds it
    (best fit);
  * a job no single node of any allowed type can hold is spread over as few nodes
    as possible of the fastest type that can hold it alone, and only when no one
    type can, over nodes of several types (it then runs at the slowest one's speed);
  * a job that does not fit is skipped (what happens next is the discipline's
    business: ordered.py).

Every tie is broken by node name, then GPU index, never by the order of the nodes
in the input, so the same cluster listed in any order gets the same placement.
A single job is placed whenever it fits at all (enough whole GPUs of its allowed
types, or one GPU with its share free): the fit test is exact.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence

from shared.placement_api import (
    FULL_GPU,
    Allocation,
    JobRequest,
    NodeFree,
)

__all__ = ["GreedyState", "greedy_allocations"]


def greedy_allocations(
    jobs: Sequence[JobRequest],
    nodes: Sequence[NodeFree],
    speed: Mapping[str, float] | None = None,
) -> list[Allocation]:
    """Allocations for the jobs of `jobs` that fit, in order; `nodes` is not modified."""
    state = GreedyState(nodes, speed or {})
    out = []
    for job in jobs:
        a = state.place(job)
        if a is not None:
            out.append(a)
    return out


class GreedyState:
    """Free capacity being handed out one job at a time (a private copy of `nodes`)."""

    def __init__(self, nodes: Sequence[NodeFree], speed: Mapping[str, float]) -> None:
        lay = _layout(nodes)
        # shared with other states of the same nodes: never modified
        self.ids, self.type, self.by_type, self._pos = lay.ids, lay.type, lay.by_type, lay.pos
        # free milli per node (name order): the input's rows, each copied on its first
        # change (`_row`), so a round that places a few jobs copies a few rows
        self.free: list[Sequence[int]] = [nodes[i].free_milli for i in lay.order]
        self._own: set[int] = set()  # positions whose row is this state's copy
        self.whole = [row.count(FULL_GPU) for row in self.free]
        self.types = sorted(self.by_type, key=lambda t: (-speed.get(t, 1.0), t))  # fastest first
        whole_by_type = dict.fromkeys(self.by_type, 0)
        for t, w in zip(self.type, self.whole, strict=True):
            whole_by_type[t] += w
        self.whole_by_type = whole_by_type
        self._allowed: dict[frozenset[str], list[str]] = {}
        # best fit without a scan: per type, per count w of whole free GPUs, a heap of the
        # positions of nodes that had w when pushed (stale entries dropped when seen);
        # built on the first whole-GPU placement
        self._fit: dict[str, list[list[int]]] | None = None
        self._most: dict[str, int] = {}  # per type, the most free on one GPU (until it changes)

    def _row(self, i: int) -> list[int]:
        """Node `i`'s free row, made this state's own before it is changed."""
        if i in self._own:
            return self.free[i]  # type: ignore[return-value]  # a list made below
        row = list(self.free[i])
        self.free[i] = row
        self._own.add(i)
        return row

    # ---- queries ------------------------------------------------------------------------
    def allowed(self, job: JobRequest) -> list[str]:
        """The job's allowed types present here, fastest first."""
        got = self._allowed.get(job.gpu_types)
        if got is None:
            got = self._allowed[job.gpu_types] = [t for t in self.types if job.allows(t)]
        return got

    def fits(self, job: JobRequest) -> bool:
        """Whether `job` alone could start on what is free now (exact)."""
        if job.gpu_milli < FULL_GPU and job.num_gpus == 1:
            if any(self.whole_by_type[t] for t in self.allowed(job)):
                return True  # a whole free GPU holds any share
            return any(self._most_free(t) >= job.gpu_milli for t in self.allowed(job))
        return sum(self.whole_by_type[t] for t in self.allowed(job)) >= job.num_gpus

    def _most_free(self, t: str) -> int:
        """The most milli free on one GPU of type `t`, kept until a GPU of `t` changes."""
        most = self._most.get(t)
        if most is None:
            free = self.free
            most = self._most[t] = max(max(free[i], default=0) for i in self.by_type[t])
        return most

    def snapshot(self) -> dict[str, Sequence[int]]:
        """Free milli per node now, by node id: rows that later changes here leave alone."""
        snap = dict(zip(self.ids, self.free, strict=True))
        for i in self._own:
            snap[self.ids[i]] = tuple(self.free[i])
        return snap

    # ---- changes ------------------------------------------------------------------------
    def place(self, job: JobRequest) -> Allocation | None:
        """Place `job` and take its GPUs; None (nothing taken) if it does not fit."""
        if job.gpu_milli < FULL_GPU and job.num_gpus == 1:
            return self._share(job)
        return self._whole(job)

    def take(self, alloc: Allocation) -> None:
        """Take an allocation made elsewhere (another placer's answer)."""
        pos = self._pos
        for node_id, idx in alloc.gpus:
            self._give(pos[node_id], idx, alloc.gpu_milli)

    def untake(self, alloc: Allocation) -> None:
        """Give back an allocation this state made (a backfill refused after all)."""
        pos = self._pos
        for node_id, idx in alloc.gpus:
            i = pos[node_id]
            self._most.pop(self.type[i], None)
            row = self._row(i)
            for g in idx:
                row[g] += alloc.gpu_milli
                if row[g] == FULL_GPU:
                    self.whole[i] += 1
                    self.whole_by_type[self.type[i]] += 1
                    self._moved(i)

    def alternatives(self, job: JobRequest, avoid: frozenset[str]) -> Iterator[Allocation]:
        """Other placements of `job` that spare the types in `avoid` (a typed EASY
        head's; empty: any type) as far as they can, each taken when yielded and to be
        `untake`n if refused: for a share, every GPU it fits on, partial ones and types
        outside `avoid` first; for whole GPUs, all of the types outside `avoid` first,
        then the rest from the others (fewest taken from the head's types)."""
        types = self.allowed(job)
        spare = [t for t in types if avoid and t not in avoid]
        if job.gpu_milli < FULL_GPU and job.num_gpus == 1:
            m = job.gpu_milli
            cands = [
                (t not in spare, f == FULL_GPU, f, i, g)
                for t in types
                for i in self.by_type[t]
                for g, f in enumerate(self.free[i])
                if f >= m
            ]
            for *_, i, g in sorted(cands):
                self._give(i, (g,), m)
                yield Allocation(job.job_id, ((self.ids[i], (g,)),), m)
            return
        n = job.num_gpus
        if not spare or sum(self.whole_by_type[t] for t in types) < n:
            return
        first = [i for t in spare for i in self.by_type[t]]
        rest = [i for t in types if t not in spare for i in self.by_type[t]]
        parts: list[tuple[str, tuple[int, ...]]] = []
        for among in (first, rest):
            for i in sorted(among, key=lambda i: (-self.whole[i], self.ids[i])):
                k = min(self.whole[i], n)
                if k:
                    parts.append((self.ids[i], self._take(i, k)))
                    n -= k
                if n == 0:
                    yield Allocation(job.job_id, tuple(sorted(parts)))
                    return

    def _give(self, i: int, idx: Sequence[int], milli: int) -> None:
        row = self._row(i)
        self._most.pop(self.type[i], None)
        for g in idx:
            if row[g] == FULL_GPU:
                self.whole[i] -= 1
                self.whole_by_type[self.type[i]] -= 1
                self._moved(i)
            row[g] -= milli

    def _moved(self, i: int) -> None:
        if self._fit is not None:
            heapq.heappush(self._fit[self.type[i]][self.whole[i]], i)

    def _best_fit(self, t: str, n: int) -> int:
        """The node of type `t` with the fewest whole free GPUs that is >= `n`, the first
        by name among those (what a scan in name order keeping strict improvements
        finds); -1 if none."""
        if self._fit is None:
            self._fit = {}
            for typ, ns in self.by_type.items():
                top = max(len(self.free[i]) for i in ns)
                buckets: list[list[int]] = [[] for _ in range(top + 1)]
                for i in ns:  # ascending: each list is already a heap
                    buckets[self.whole[i]].append(i)
                self._fit[typ] = buckets
        buckets = self._fit[t]
        for w in range(n, len(buckets)):
            heap = buckets[w]
            while heap and self.whole[heap[0]] != w:
                heapq.heappop(heap)
            if heap:
                return heap[0]
        return -1

    def _share(self, job: JobRequest) -> Allocation | None:
        m = job.gpu_milli
        for t in self.allowed(job):
            best: tuple[int, int, int] | None = None  # (free milli, node, gpu): tightest GPU
            fresh: tuple[int, int, int] | None = None  # (whole free, node, gpu)
            for i in self.by_type[t]:
                for g, f in enumerate(self.free[i]):
                    if f < m:
                        continue
                    if f < FULL_GPU:
                        if best is None or f < best[0]:
                            best = (f, i, g)
                    elif fresh is None or self.whole[i] < fresh[0]:
                        fresh = (self.whole[i], i, g)
            pick = best or fresh
            if pick is not None:
                _, i, g = pick
                self._give(i, (g,), m)
                return Allocation(job.job_id, ((self.ids[i], (g,)),), m)
        return None

    def _whole(self, job: JobRequest) -> Allocation | None:
        n = job.num_gpus
        types = self.allowed(job)
        if sum(self.whole_by_type[t] for t in types) < n:
            return None
        for t in types:  # one node, fastest type first, best fit
            best = self._best_fit(t, n)
            if best >= 0:
                return Allocation(job.job_id, ((self.ids[best], self._take(best, n)),))
        for t in types:  # several nodes of one type, as few as possible
            if self.whole_by_type[t] >= n:
                return self._spread(job, self.by_type[t])
        return self._spread(job, [i for t in types for i in self.by_type[t]])

    def _spread(self, job: JobRequest, among: list[int]) -> Allocation:
        need = job.num_gpus
        parts: list[tuple[str, tuple[int, ...]]] = []
        for i in sorted(among, key=lambda i: (-self.whole[i], self.ids[i])):
            k = min(self.whole[i], need)
            if k == 0:
                break
            parts.append((self.ids[i], self._take(i, k)))
            need -= k
            if need == 0:
                break
        return Allocation(job.job_id, tuple(sorted(parts)))

    def _take(self, i: int, k: int) -> tuple[int, ...]:
        """The first `k` whole free GPUs of node `i`, taken."""
        got = tuple(g for g, f in enumerate(self.free[i]) if f == FULL_GPU)[:k]
        self._give(i, got, FULL_GPU)
        return got


class _Layout:
    """What a `GreedyState` derives from the nodes' names and types alone: the name
    order, and the positions of each type's nodes in it."""

    __slots__ = ("by_type", "ids", "names", "order", "pos", "type", "types_in")

    def __init__(self, names: list[str], types: list[str]) -> None:
        self.names, self.types_in = names, types
        self.order = sorted(range(len(names)), key=names.__getitem__)
        self.ids = [names[i] for i in self.order]
        self.pos = {n: i for i, n in enumerate(self.ids)}  # node id -> position
        self.type = [types[i] for i in self.order]
        by_type: dict[str, list[int]] = {}
        for i, t in enumerate(self.type):
            by_type.setdefault(t, []).append(i)
        self.by_type = by_type  # node positions (name order) per type


_last: list[_Layout] = []  # the latest layout: a simulation passes the same nodes each round


def _layout(nodes: Sequence[NodeFree]) -> _Layout:
    names = [n.node_id for n in nodes]
    types = [n.gpu_type for n in nodes]
    if _last and _last[0].names == names and _last[0].types_in == types:
        return _last[0]
    lay = _Layout(names, types)
    _last[:] = [lay]
    return lay
