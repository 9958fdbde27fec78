"""What to fetch ahead and what to evict: the part that differs between strategies.

* `PlanPolicy` (10Cache): the plan's prefetch order is the recorded access
  order of one step; a cursor follows the accesses; among the next LOOKAHEAD
  accesses, the tensors not in the fast tier yet are fetched ahead: `window`
  of them at least (at least PREFETCH_AHEAD, whatever lead the plan's
  buffers were sized for: a prefetch may also take a free buffer of a larger
  class), and past that while fewer than `lead_bytes` are ahead (a lead in
  bytes: counted in tensors only, a run of small ones used it up);
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
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

__all__ = ["LayerOrderPolicy", "OnDemandPolicy", "PlanPolicy", "Policy"]

_FAR = float("inf")
LOOKAHEAD = 256  # accesses a plan's prefetch looks ahead for its lead
PREFETCH_AHEAD = 8  # a plan's fetches in flight at least (buffers permitting)
COUNT_LOOKAHEAD = 64  # the lookahead when the lead counted tensors only (no bytes)
WRITE_BEHIND_AFTER = 64  # write-behind: next use further than this many accesses


class Policy(Protocol):
    name: str
    window: int  # most tensors fetched ahead and not yet used
    lead_bytes: int | None  # most bytes fetched ahead and not yet used (None: no cap)
    protect_sooner: bool  # a prefetch may only evict tensors needed later than it

    def write_behind(self, tensor_id: str) -> bool:
        """Write this changed tensor back now (it is not needed again soon)."""
        ...

    def begin_step(self) -> None: ...

    def on_use(self, tensor_id: str, clock: int) -> None: ...

    def upcoming(self) -> Iterable[tuple[str, float]]: ...

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

    def ahead(self, n: int) -> Iterator[tuple[str, float]]:
        """The next `n` accesses with their distances, lazily (the cache stops early)."""
        size = len(self.order)
        order, pos = self.order, self.pos
        for k in range(min(n, size)):
            yield order[(pos + k) % size], float(k)


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
        lead_bytes: int | None = None,
        lookahead: int = LOOKAHEAD,
    ) -> None:
        """`window` tensors fetched ahead at least (`ahead` at run time), and past
        that while fewer than `lead_bytes` are (at most `cache.MAX_AHEAD`
        tensors), among the next `lookahead` accesses."""
        self.lead = window  # the lead the plan's buffers were sized for
        self._write_behind = write_behind
        # fetches in flight at run time: more than the sized lead where buffers
        # allow (a free one, or one whose tensor is needed later: never sooner)
        self.window = max(window, ahead)
        self.lead_bytes = lead_bytes
        self.lookahead = lookahead
        self._cursor = _Cursor(order, max(256, lookahead))

    def begin_step(self) -> None:
        self._cursor.pos = 0

    def on_use(self, tensor_id: str, clock: int) -> None:
        self._cursor.advance(tensor_id)

    def write_behind(self, tensor_id: str) -> bool:
        return self._write_behind and self._cursor.distance(tensor_id) > WRITE_BEHIND_AFTER

    def upcoming(self) -> Iterable[tuple[str, float]]:
        """The next `lookahead` accesses: the cache fetches those not in the fast
        tier yet, `window` of them at least and then until `lead_bytes` are
        ahead (repeats and tensors already there are passed over, so the lead
        counts fetches, not accesses)."""
        return self._cursor.ahead(self.lookahead if self.window else 0)

    def eviction_rank(self, tensor_id: str, last_use: int) -> float:
        return self._cursor.distance(tensor_id)


class LayerOrderPolicy:
    """Parameters in module order; prefetch the next `window` in the direction the
    step is going (forward: later layers, backward: earlier ones)."""

    name = "fixed"
    protect_sooner = False
    lead_bytes: int | None = None

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
    lead_bytes: int | None = None

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
