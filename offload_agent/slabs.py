"""Buffers per size class, carved from one slab per class, allocated once and reused.

A `SlabPool` serves one tier (fast or host). For each size class it makes one
allocation of `count * size_class` bytes (size classes are multiples of ALIGN)
and hands out fixed slots from it; nothing is allocated again until `build`
is called with a new layout (a new plan). This is 10Cache's buffer scheme; the
ZeRO-Infinity baseline uses the same pool with a single class
(`buffer_count` x `buffer_size`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from offload_agent.device import ALIGN

__all__ = ["PoolExhausted", "SlabPool", "Slot"]


class PoolExhausted(RuntimeError):
    """Every slot of a size class is taken (and none can be evicted)."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One buffer: `view` is `size_class` bytes, ALIGN-aligned."""

    size_class: int
    index: int
    view: torch.Tensor

    @property
    def address(self) -> int:
        return int(self.view.data_ptr())


class SlabPool:
    """Slots by size class for one tier, under a byte budget."""

    def __init__(self, tier: str, alloc: Callable[[int], torch.Tensor], budget: int) -> None:
        self.tier = tier
        self.budget = budget
        self._alloc = alloc
        self._free: dict[int, list[Slot]] = {}
        self._all: dict[int, list[Slot]] = {}
        self._starts: list[int] = []
        self._by_start: list[Slot] = []
        self.allocated_bytes = 0
        self.overflow_bytes = 0  # slots added past the layout (`grow`)

    def build(self, layout: Mapping[int, int]) -> None:
        """Allocate `count` slots of each `size_class` (one slab per class)."""
        total = sum(size * count for size, count in layout.items())
        if total > self.budget:
            raise ValueError(
                f"{self.tier} buffers need {total} bytes but the budget is {self.budget}"
            )
        self._free, self._all, pairs = {}, {}, []
        for size, count in sorted(layout.items()):
            if size % ALIGN or count <= 0:
                continue
            slab = self._alloc(size * count)
            slots = [Slot(size, i, slab[i * size : (i + 1) * size]) for i in range(count)]
            self._all[size] = slots
            self._free[size] = list(reversed(slots))
            pairs += [(s.address, s) for s in slots]
        pairs.sort(key=lambda p: p[0])
        self._starts = [a for a, _ in pairs]
        self._by_start = [s for _, s in pairs]
        self.allocated_bytes = total
        self.overflow_bytes = 0

    def grow(self, size_class: int) -> Slot:
        """One more slot of `size_class`, past the layout and the budget: for a
        demand no slot can serve because every one is pinned (a step that holds
        more tensors of a class at once than the layout foresaw). It stays in the
        pool, so the next step does not allocate again."""
        slot = Slot(size_class, self.capacity(size_class), self._alloc(size_class))
        self._all.setdefault(size_class, []).append(slot)
        self._free.setdefault(size_class, [])
        i = bisect.bisect_left(self._starts, slot.address)
        self._starts.insert(i, slot.address)
        self._by_start.insert(i, slot)
        self.allocated_bytes += size_class
        self.overflow_bytes += size_class
        return slot

    def classes(self) -> list[int]:
        return sorted(self._all)

    def capacity(self, size_class: int) -> int:
        return len(self._all.get(size_class, ()))

    def free_count(self, size_class: int) -> int:
        return len(self._free.get(size_class, ()))

    def take(self, size_class: int) -> Slot:
        free = self._free.get(size_class)
        if not free:
            raise PoolExhausted(f"{self.tier}: no free buffer of {size_class} bytes")
        return free.pop()

    def give_back(self, slot: Slot) -> None:
        self._free[slot.size_class].append(slot)

    def locate(self, address: int) -> Slot | None:
        """The slot whose bytes contain `address`, if any (for saved-tensor hooks)."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        slot = self._by_start[i]
        return slot if address < slot.address + slot.size_class else None
