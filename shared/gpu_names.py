"""Mapping of a trace's GPU type names onto a cluster's.

Traces spell the same GPU differently (`V100_16GB` in RLTune's CSV, `V100M16` in
Alibaba 2023, `V100` in PAI 2020, lower case elsewhere). A trace name maps to:

1. the cluster type of the same name, ignoring case and `-`/`_`/spaces;
2. else the cluster types of the same canonical model (aliases below);
3. else, for a memory variant (V100M16), the cluster's plain family (V100), or
   for a plain family name (V100), every variant of it the cluster has;
4. else nothing: the job keeps the trace name, which no node has, and the
   simulator rejects it with a reason naming the type.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["TypeMapper", "canonical"]

_ALIASES = {
    "V10016GB": "V100M16",
    "V100SXM216GB": "V100M16",
    "V10032GB": "V100M32",
    "V100SXM232GB": "V100M32",
    "TESLAV100": "V100",
    "TESLAP100": "P100",
    "TESLAT4": "T4",
    "TESLAK80": "K80",
}
_FAMILY = re.compile(r"^([A-Z]+\d+)(M\d+)$")


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).upper()


def canonical(name: str) -> str:
    """The canonical spelling of a GPU model name (`v100_32gb` -> `V100M32`)."""
    n = _norm(name)
    return _ALIASES.get(n, n)


def _family(canon: str) -> str:
    m = _FAMILY.match(canon)
    return m.group(1) if m else canon


class TypeMapper:
    """Maps trace GPU names onto the names of one cluster (cached per name)."""

    def __init__(self, cluster_types: Iterable[str]) -> None:
        self.cluster_types = tuple(sorted(set(cluster_types)))
        self._by_canon: dict[str, list[str]] = {}
        self._by_family: dict[str, list[str]] = {}
        for t in self.cluster_types:
            c = canonical(t)
            self._by_canon.setdefault(c, []).append(t)
            self._by_family.setdefault(_family(c), []).append(t)
        self._cache: dict[str, tuple[str, ...]] = {}

    def map_one(self, name: str) -> tuple[str, ...]:
        """Cluster types a trace type name stands for; `(name,)` when none does."""
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        c = canonical(name)
        found = self._by_canon.get(c)
        if not found and _family(c) != c:  # V100M16 on a cluster that only says V100
            found = self._by_canon.get(_family(c))
        if not found and _family(c) == c:  # V100 on a cluster of V100M16 + V100M32
            found = self._by_family.get(c)
        out = tuple(sorted(found)) if found else (name,)
        self._cache[name] = out
        return out

    def map_types(self, names: Iterable[str]) -> tuple[str, ...]:
        """Union of the mappings of `names`, sorted; () stays () (any type)."""
        out: set[str] = set()
        for n in names:
            out.update(self.map_one(n))
        return tuple(sorted(out))
