"""What to fetch ahead and what to evict: the part that differs between strategies.

* `PlanPolicy` (10Cache): the plan's prefetch order is the recorded access
  order of one step; a cursor follows the accesses; up to `window` tensors
  among the next LOOKAHEAD accesses that are not in the fast tier yet are
  fetched ahead (at least PREFETCH_AHEAD, whatever lead the plan's buffers
  were sized for: a prefetch may also take a free buffer of a larger class);
  the victim is the buffer whose next use is furthest away (Belady's rule,
  exact here because the order repeats every step). A prefetch never evicts
  something needed sooner than what it brings in. With `write_behind` (off by
  default, `EngineConfig.write_behind`), a changed tensor whose next use lies
  beyond the lookahead (an optimizer state after its step) is written back as
  soon as it is released, so the prefetch that later takes its buffer need
  not write it first.
* `LayerOrderPolicy` (ZeRO-Infinity style): prefetch the next `window`
  parameters in module (layer) order, forward in the forward pass and backward
  in the backward pass; optimizer states come on demand; evict the least
  recently used.
* `OnDemandPolicy` (naive offload, and `none`): no prefetch, evict the least
  recently used.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

__all__ = ["LayerOrderPolicy", "OnDemandPolicy", "PlanPolicy", "Policy"]

_FAR = float("inf")
LOOKAHEAD = 64  # accesses a plan's prefetch looks ahead for its `window` fetches
PREFETCH_AHEAD = 8  # a plan's fetches in flight at least (buffers permitting)


class Policy(Protocol):
    name: str
    window: int
    protect_sooner: bool  # a prefetch may only evict tensors needed later than it

    def write_behind(self, tensor_id: str) -> bool:
        """Write this changed tensor back now (it is not needed again soon)."""
        ...

    def begin_step(self) -> None: ...

    def on_use(self, tensor_id: str, clock: int) -> None: ...

    def upcoming(self) -> list[tuple[str, float]]: ...

    def eviction_rank(self, tensor_id: str, last_use: int) -> float: ...


class _Cursor:
    """Position in a cyclic order with repeats; finds each tensor's next use."""

    def __init__(self, order: Sequence[str], lookahead: int = 256) -> None:
        self.order = list(order)
        self.pos = 0
        self._lookahead = lookahead
        self._where: dict[str, list[int]] = {}
        for i, tid in enumerate(self.order):
            self._where.setdefault(tid, []).append(i)

    def advance(self, tensor_id: str) -> None:
        hits = self._where.get(tensor_id)
        if not hits:
            return
        i = bisect.bisect_left(hits, self.pos)
        if i < len(hits) and hits[i] - self.pos <= self._lookahead:
            self.pos = hits[i] + 1
        elif hits[0] + len(self.order) - self.pos <= self._lookahead:
            self.pos = hits[0] + 1  # wrapped into the next step
        # else: an access the order does not predict here; keep the cursor

    def distance(self, tensor_id: str) -> float:
        """Accesses until the next use of `tensor_id` (cyclic), inf if never used."""
        hits = self._where.get(tensor_id)
        if not hits:
            return _FAR
        i = bisect.bisect_left(hits, self.pos)
        if i < len(hits):
            return float(hits[i] - self.pos)
        return float(hits[0] + len(self.order) - self.pos)

    def ahead(self, n: int) -> list[tuple[str, float]]:
        size = len(self.order)
        if not size:
            return []
        return [(self.order[(self.pos + k) % size], float(k)) for k in range(min(n, size))]


class PlanPolicy:
    name = "tencache"
    protect_sooner = True

    def __init__(
        self,
        order: Sequence[str],
        window: int,
        ahead: int = PREFETCH_AHEAD,
        *,
        write_behind: bool = False,
    ) -> None:
        self.lead = window  # the lead the plan's buffers were sized for
        self._write_behind = write_behind
        # fetches in flight at run time: more than the sized lead where buffers
        # allow (a free one, or one whose tensor is needed later: never sooner)
        self.window = max(window, ahead)
        self._cursor = _Cursor(order)

    def begin_step(self) -> None:
        self._cursor.pos = 0

    def on_use(self, tensor_id: str, clock: int) -> None:
        self._cursor.advance(tensor_id)

    def write_behind(self, tensor_id: str) -> bool:
        return self._write_behind and self._cursor.distance(tensor_id) > LOOKAHEAD

    def upcoming(self) -> list[tuple[str, float]]:
        """The next LOOKAHEAD accesses: the cache fetches up to `window` of them
        that are not in the fast tier yet (repeats and tensors already there are
        passed over, so the lead is `window` fetches, not `window` accesses)."""
        return self._cursor.ahead(LOOKAHEAD if self.window else 0)

    def eviction_rank(self, tensor_id: str, last_use: int) -> float:
        return self._cursor.distance(tensor_id)


class LayerOrderPolicy:
    """Parameters in module order; prefetch the next `window` in the direction the
    step is going (forward: later layers, backward: earlier ones)."""

    name = "fixed"
    protect_sooner = False

    def __init__(self, layer_order: Sequence[str], window: int) -> None:
        self.window = window
        self._order = list(layer_order)
        self._index = {t: i for i, t in enumerate(self._order)}
        self._at = -1
        self._dir = 1

    def begin_step(self) -> None:
        self._at, self._dir = -1, 1

    def on_use(self, tensor_id: str, clock: int) -> None:
        i = self._index.get(tensor_id)
        if i is None:
            return
        if i != self._at:
            self._dir = 1 if i > self._at else -1
        self._at = i

    def upcoming(self) -> list[tuple[str, float]]:
        out = []
        for k in range(1, self.window + 1):
            i = self._at + k * self._dir
            if 0 <= i < len(self._order):
                out.append((self._order[i], float(k)))
        return out

    def eviction_rank(self, tensor_id: str, last_use: int) -> float:
        return float(-last_use)

    def write_behind(self, tensor_id: str) -> bool:
        return False  # no knowledge of the next use: write back on eviction


class OnDemandPolicy:
    name = "lru"
    protect_sooner = False
    window = 0

    def begin_step(self) -> None:
        return None

    def on_use(self, tensor_id: str, clock: int) -> None:
        return None

    def upcoming(self) -> list[tuple[str, float]]:
        return []

    def eviction_rank(self, tensor_id: str, last_use: int) -> float:
        return float(-last_use)

    def write_behind(self, tensor_id: str) -> bool:
        return False  # no knowledge of the next use: write back on eviction
