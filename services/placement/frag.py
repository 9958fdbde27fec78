"""GPU fragmentation as defined by "Beware of Fragmentation" (Weng et al., USENIX ATC'23).

Given a target workload M (pod shapes m with popularity p_m), the fragmentation
of node n is the expected amount of its free GPU capacity that a pod drawn from
M could not use:

    F_n(M) = Σ_m p_m · frag(n, m)
    frag(n, m) = all free milli of n                 if m may not run on n's type,
                                                     or m does not fit on n
               = Σ_{GPU g of n, free_g < milli_m} free_g   otherwise

(GPU dimensions only; the paper also counts CPU, which placement here does not
see.) Because a whole-GPU pod fits iff the node has k_m whole free GPUs, and a
sharing pod fits iff one GPU has milli_m free, F_n splits exactly into a term
for the node's whole free GPUs and one per partially used GPU:

    F_n = 1000 · W · a_t(W) + Σ_{g: 0 < f_g < 1000} f_g · b_t(f_g)
    a_t(W) = Σ_m p_m [m may not use t  or  (m whole and k_m > W)]
    b_t(f) = Σ_m p_m [m may not use t  or  milli_m > f]

with W the node's whole free GPUs and t its type. The split is what lets the
MILP charge fragmentation per node pattern and per GPU pattern (milp.py), and
FGD evaluate a placement in O(1) per node class (baselines.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shared.placement_api import FULL_GPU, JobRequest, NodeFree

__all__ = ["FragTable", "PodShape", "Workload", "cluster_frag_milli", "node_frag"]


@dataclass(frozen=True, slots=True)
class PodShape:
    """What fragmentation looks at in a pod: GPUs, share per GPU, allowed types."""

    num_gpus: int
    gpu_milli: int
    gpu_types: frozenset[str] = frozenset()  # empty = any

    @property
    def whole(self) -> bool:
        return self.gpu_milli >= FULL_GPU

    def allows(self, gpu_type: str) -> bool:
        return not self.gpu_types or gpu_type in self.gpu_types


@dataclass(frozen=True)
class Workload:
    """The target workload M: pod shapes and their popularity (summing to 1)."""

    shapes: tuple[tuple[PodShape, float], ...]
    _tables: dict[str, FragTable] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, pods: Iterable[JobRequest | PodShape]) -> Workload:
        """Popularity = share of `pods` with that shape (the paper weighs by count)."""
        counts: Counter[PodShape] = Counter()
        for p in pods:
            shape = p if isinstance(p, PodShape) else PodShape(p.num_gpus, p.gpu_milli, p.gpu_types)
            counts[shape] += 1
        total = sum(counts.values()) or 1
        return cls(tuple((s, c / total) for s, c in sorted(counts.items(), key=_shape_key)))

    def pressure(self, free_by_type: Mapping[str, float]) -> dict[str, float]:
        """κ_t: how much of the demand that may run only on some types falls on t,
        over t's share of the free capacity (0 when no restricted pod wants t).

        Restricted demand is spread over its allowed types by their free capacity.
        """
        total_free = sum(free_by_type.values()) or 1.0
        demand = sum(p * s.num_gpus * s.gpu_milli for s, p in self.shapes) or 1.0
        on: dict[str, float] = dict.fromkeys(free_by_type, 0.0)
        for s, p in self.shapes:
            allowed = [t for t in s.gpu_types if free_by_type.get(t, 0.0) > 0]
            room = sum(free_by_type[t] for t in allowed)
            for t in allowed:
                on[t] += p * s.num_gpus * s.gpu_milli * free_by_type[t] / room
        return {
            t: (on[t] / demand) / (free / total_free) if free > 0 else 0.0
            for t, free in free_by_type.items()
        }

    def table(self, gpu_type: str) -> FragTable:
        """Fragmentation coefficients of one GPU type (cached)."""
        tab = self._tables.get(gpu_type)
        if tab is None:
            tab = FragTable(gpu_type, self.shapes)
            self._tables[gpu_type] = tab
        return tab


class FragTable:
    """a_t(W) and b_t(f) of the module docstring for one GPU type, memoised."""

    def __init__(self, gpu_type: str, shapes: Sequence[tuple[PodShape, float]]) -> None:
        # p_no: popularity of pods that may not use this type at all
        self._p_no = sum(p for s, p in shapes if not s.allows(gpu_type))
        # (GPUs needed, popularity) of whole-GPU pods that may use the type
        self._whole = [(s.num_gpus, p) for s, p in shapes if s.allows(gpu_type) and s.whole]
        # (milli per GPU, popularity) of every pod that may use the type
        self._milli = [(min(s.gpu_milli, FULL_GPU), p) for s, p in shapes if s.allows(gpu_type)]
        self._node: dict[int, float] = {}
        self._gpu: dict[int, float] = {}

    def node(self, whole_free: int) -> float:
        """Fragment (milli) of a node's `whole_free` untouched GPUs."""
        v = self._node.get(whole_free)
        if v is None:
            a = self._p_no + sum(p for k, p in self._whole if k > whole_free)
            v = self._node[whole_free] = FULL_GPU * whole_free * a
        return v

    def gpu(self, free: int) -> float:
        """Fragment (milli) of one partially used GPU with `free` milli left."""
        if free <= 0 or free >= FULL_GPU:
            return 0.0
        v = self._gpu.get(free)
        if v is None:
            b = self._p_no + sum(p for m, p in self._milli if m > free)
            v = self._gpu[free] = free * b
        return v


def node_frag(free_milli: Sequence[int], table: FragTable) -> float:
    """F_n of one node in milli-GPUs, from its per-GPU free milli."""
    whole = sum(1 for f in free_milli if f >= FULL_GPU)
    return table.node(whole) + sum(table.gpu(f) for f in free_milli)


def cluster_frag_milli(nodes: Iterable[NodeFree], workload: Workload) -> float:
    """Σ_n F_n(M) in milli-GPUs over the cluster."""
    return sum(node_frag(n.free_milli, workload.table(n.gpu_type)) for n in nodes)


def _shape_key(item: tuple[PodShape, int]) -> tuple[int, int, tuple[str, ...]]:
    s = item[0]
    return (s.num_gpus, s.gpu_milli, tuple(sorted(s.gpu_types)))
