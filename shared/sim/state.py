"""Cluster state of the simulator: free milli-GPUs per GPU, with the indices that
keep a round cheap when thousands of jobs wait.

* whole free GPUs per node, per type and in total (fit tests in O(types));
* the sorted list of nodes with anything free and, beside it, their `NodeFree`,
  each rebuilt only when its node changes (the placer is handed only nodes with
  free capacity: a full node can take nothing, so the answer is the same).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from shared.cluster import ClusterSpec
from shared.placement_api import FULL_GPU, Allocation, NodeFree

__all__ = ["Claim", "ClusterState"]

Claim = tuple[tuple[int, tuple[int, ...]], ...]  # ((node index, (gpu index, ...)), ...)


class ClusterState:
    def __init__(self, cluster: ClusterSpec) -> None:
        self.node_ids = [n.node_id for n in cluster.nodes]
        self.node_type = [n.gpu_type for n in cluster.nodes]
        self.index = {nid: i for i, nid in enumerate(self.node_ids)}
        self.size = [n.gpus for n in cluster.nodes]
        self.free = [[FULL_GPU] * n.gpus for n in cluster.nodes]
        self.whole = list(self.size)
        self.total_by_type = cluster.gpus_by_type()
        self.whole_by_type = dict(self.total_by_type)
        self.whole_total = sum(self.size)
        self.total = self.whole_total
        self.held_milli = 0  # milli-GPUs held by running jobs
        self.partial = 0  # GPUs partly taken by sharing jobs (0 < free < 1000)
        self._open = [i for i, g in enumerate(self.size) if g > 0]  # nodes with anything free
        # `NodeFree` of each node of `_open`, position for position (kept as they change)
        self._nodes = [self._node_free(i) for i in self._open]
        self._by_type: dict[str, list[int]] = {}
        for i, t in enumerate(self.node_type):
            self._by_type.setdefault(t, []).append(i)
        self._most: dict[str, int] = {}  # per type, the most free on one GPU (until it changes)

    # ---- queries ----------------------------------------------------------------------
    def whole_free(self, types: frozenset[str]) -> int:
        """Whole free GPUs of the allowed types (empty = any)."""
        if not types:
            return self.whole_total
        return sum(self.whole_by_type.get(t, 0) for t in types)

    def fits(self, num_gpus: int, milli: int, types: frozenset[str]) -> bool:
        """Whether a job could start now if it were alone in the window."""
        if milli >= FULL_GPU or num_gpus > 1:
            return num_gpus <= self.whole_free(types)
        if self.whole_free(types) >= 1:
            return True
        return any(self._most_free(t) >= milli for t in (types or self._by_type))

    def _most_free(self, t: str) -> int:
        """The most milli free on one GPU of type `t` (0: none, or no such type), kept
        until a GPU of `t` changes (a round asks for every window job)."""
        most = self._most.get(t)
        if most is None:
            free = self.free
            most = max((max(free[i], default=0) for i in self._by_type.get(t, ())), default=0)
            self._most[t] = most
        return most

    def free_nodes(self) -> list[NodeFree]:
        """`NodeFree` of every node with some free capacity, in cluster order."""
        return list(self._nodes)

    def _node_free(self, i: int) -> NodeFree:
        return NodeFree(self.node_ids[i], self.node_type[i], tuple(self.free[i]))

    def fragmentation(self, gpu_type: str | None = None) -> float:
        free = partial = 0
        for i in self._open:
            if gpu_type is not None and self.node_type[i] != gpu_type:
                continue
            free += self.whole[i]
            if self.whole[i] < self.size[i]:
                partial += self.whole[i]
        return partial / free if free else 0.0

    # ---- changes ----------------------------------------------------------------------
    def claim(self, alloc: Allocation, num_gpus: int) -> Claim | None:
        """Take the GPUs of `alloc` if they are all really free; None (nothing taken) if not."""
        milli = alloc.gpu_milli
        claim: list[tuple[int, tuple[int, ...]]] = []
        count = 0
        for node_id, gpus in alloc.gpus:
            i = self.index.get(node_id)
            if i is None or len(set(gpus)) != len(gpus):
                return None
            row = self.free[i]
            for g in gpus:
                if not 0 <= g < len(row) or row[g] < milli:
                    return None
            claim.append((i, tuple(gpus)))
            count += len(gpus)
        if count != num_gpus or (milli < FULL_GPU and count != 1):
            return None
        for i, gpus in claim:
            self._change(i, gpus, -milli)
        return tuple(claim)

    def release(self, claim: Claim, milli: int) -> None:
        for i, gpus in claim:
            self._change(i, gpus, milli)

    def _change(self, i: int, gpus: Iterable[int], delta: int) -> None:
        row = self.free[i]
        t = self.node_type[i]
        was_open = self.whole[i] > 0 or any(row)
        for g in gpus:
            before = row[g]
            row[g] = after = before + delta
            self.held_milli -= delta
            self.partial += (0 < after < FULL_GPU) - (0 < before < FULL_GPU)
            if before == FULL_GPU:
                self.whole[i] -= 1
                self.whole_by_type[t] -= 1
                self.whole_total -= 1
            elif after == FULL_GPU:
                self.whole[i] += 1
                self.whole_by_type[t] += 1
                self.whole_total += 1
        self._most.pop(t, None)
        is_open = any(row)
        pos = bisect_left(self._open, i)
        if is_open and was_open:
            self._nodes[pos] = self._node_free(i)
        elif is_open:
            self._open.insert(pos, i)
            self._nodes.insert(pos, self._node_free(i))
        elif was_open:
            del self._open[pos]
            del self._nodes[pos]
