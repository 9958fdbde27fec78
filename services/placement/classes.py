"""Shape classes and fill patterns: what the MILP counts instead of nodes and GPUs.

Two levels, because the two kinds of demand touch disjoint resources:

* node classes (t, W): nodes of GPU type t with W whole free GPUs. Whole-GPU
  jobs fit on a node iff it has enough whole free GPUs, so two nodes of one
  class are interchangeable for them, whatever their partially used GPUs hold;
* GPU classes (t, f): partially used GPUs of type t with f milli free
  (0 < f < 1000), plus one "fresh" class per type (f = 1000) for whole free
  GPUs that the solution opens to sharing jobs. A sharing job is single-GPU,
  so GPUs with the same (t, f) are interchangeable for it.

A pattern is what one member of a class receives: for a node, a multiset of
whole-GPU slot sizes (a size-1 slot may also be opened for sharing); for a GPU,
a multiset of share sizes. A whole-GPU slot of an offloading job is its own kind
of slot, keyed k + kind · STREAM (kind >= 1 per offloading job kind; slot_gpus
gives its k back), so a node pattern says which streaming jobs it starts on one
node (offload_term.py charges what they cost each other); without offloading
jobs every key is plain. The MILP picks how many
members take each pattern, so the model grows with distinct shapes and window
sizes, not with nodes.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from shared.placement_api import FULL_GPU, NodeFree

__all__ = [
    "STREAM",
    "ClassIndex",
    "GpuRef",
    "PatternCache",
    "enumerate_patterns",
    "index_classes",
    "slot_gpus",
    "used_capacity",
]

GpuRef = tuple[int, int]  # (node position in the input, GPU index on that node)
STREAM = 1 << 16  # slot key step per streaming kind (a whole-GPU slot of an offloading job)


def slot_gpus(key: int) -> int:
    """GPUs (or milli) a slot of this key takes: a streaming slot's key less STREAM."""
    return key % STREAM


@dataclass(frozen=True, slots=True)
class ClassIndex:
    """The cluster's free capacity grouped into classes, members in input order."""

    # (t, W) -> positions of nodes of type t with W >= 1 whole free GPUs
    node_classes: dict[tuple[str, int], tuple[int, ...]]
    # (t, f) -> partially used GPUs of type t with f milli free, 0 < f < 1000
    gpu_classes: dict[tuple[str, int], tuple[GpuRef, ...]]
    # node position -> its whole free GPU indices, ascending
    whole_idx: dict[int, tuple[int, ...]]


def index_classes(nodes: Sequence[NodeFree]) -> ClassIndex:
    node_cls: dict[tuple[str, int], list[int]] = defaultdict(list)
    gpu_cls: dict[tuple[str, int], list[GpuRef]] = defaultdict(list)
    whole_idx: dict[int, tuple[int, ...]] = {}
    for i, n in enumerate(nodes):
        whole = tuple(g for g, f in enumerate(n.free_milli) if f >= FULL_GPU)
        if whole:
            node_cls[(n.gpu_type, len(whole))].append(i)
            whole_idx[i] = whole
        for g, f in enumerate(n.free_milli):
            if 0 < f < FULL_GPU:
                gpu_cls[(n.gpu_type, f)].append((i, g))
    return ClassIndex(
        node_classes={k: tuple(v) for k, v in node_cls.items()},
        gpu_classes={k: tuple(v) for k, v in gpu_cls.items()},
        whole_idx=whole_idx,
    )


def enumerate_patterns(
    capacity: int,
    sizes: Sequence[int],
    max_counts: Sequence[int],
    limit: int,
) -> tuple[list[tuple[int, ...]], bool]:
    """Non-empty multisets of `sizes` (count vectors, count_i <= max_counts[i]) with
    Σ count_i · size_i <= capacity.

    Past `limit` patterns, keep every single-slot pattern and then the fullest
    ones (least capacity left), and say so (the second value): the model stays
    feasible for every job but may miss the optimum.
    """
    return _select(_enumerate(capacity, sizes, max_counts, 50 * limit), sizes, limit)


class PatternCache:
    """Patterns of one (top capacity, sizes, max_counts) enumerated once, then cut per
    class: classes of one type share sizes and differ in capacity (<= top)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # (top, sizes, max_counts) -> (used capacity ascending, patterns in that order)
        self._all: dict[
            tuple[int, tuple[int, ...], tuple[int, ...]], tuple[list[int], list[tuple[int, ...]]]
        ] = {}

    def get(
        self, capacity: int, top: int, sizes: Sequence[int], max_counts: Sequence[int]
    ) -> tuple[list[tuple[int, ...]], list[int], bool]:
        """enumerate_patterns(capacity, ...) for any capacity <= top, with each
        pattern's used capacity."""
        key = (top, tuple(sizes), tuple(max_counts))
        if key not in self._all:
            pats = _enumerate(top, sizes, max_counts, 50 * self.limit)
            pats.sort(key=lambda p: used_capacity(p, sizes))
            self._all[key] = ([used_capacity(p, sizes) for p in pats], pats)
        used, pats = self._all[key]
        end = bisect.bisect_right(used, capacity)
        if end <= self.limit:
            return pats[:end], used[:end], False
        kept, _ = _select(pats[:end], sizes, self.limit)
        return kept, [used_capacity(p, sizes) for p in kept], True


def _enumerate(
    capacity: int, sizes: Sequence[int], max_counts: Sequence[int], hard_cap: int
) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    counts = [0] * len(sizes)

    def rec(i: int, left: int) -> None:
        if len(out) >= hard_cap:
            return
        if i == len(sizes):
            if left < capacity:  # non-empty
                out.append(tuple(counts))
            return
        size = slot_gpus(sizes[i])
        top = min(max_counts[i], left // size) if size > 0 else 0
        for c in range(top + 1):
            counts[i] = c
            rec(i + 1, left - c * size)
        counts[i] = 0

    rec(0, capacity)
    return out


def _select(
    pats: list[tuple[int, ...]], sizes: Sequence[int], limit: int
) -> tuple[list[tuple[int, ...]], bool]:
    if len(pats) <= limit:
        return pats, False
    singles = [p for p in pats if sum(p) == 1]
    rest = sorted(
        (p for p in pats if sum(p) > 1), key=lambda p: used_capacity(p, sizes), reverse=True
    )
    return singles + rest[: max(limit - len(singles), 0)], True


def used_capacity(p: tuple[int, ...], sizes: Sequence[int]) -> int:
    return sum(c * slot_gpus(s) for c, s in zip(p, sizes, strict=True))
