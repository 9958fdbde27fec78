"""Where each tensor is: one enum per tensor, owned by one tracker.

Only the engine's main thread changes an `Entry`; I/O threads move bytes and
report back through futures. A tensor is either ready in the fast tier
(`FAST`), on its way there (`FETCHING`), or only at its home (`HOST` slab or
`NVME` file). Tensors the plan keeps in the fast tier for good have home
`FAST` and are never evicted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from offload_agent.device import ALIGN, Ready, align_up
from offload_agent.slabs import Slot

__all__ = ["Entry", "Residency", "TensorSpec", "Tier", "size_class_of"]


class Tier(enum.Enum):
    FAST = "gpu"  # ready in a fast-tier buffer (GPU, or the host stand-in)
    FETCHING = "fetching"  # a copy into its fast buffer is in flight
    HOST = "host"  # only in its host slab slot
    NVME = "nvme"  # only in its swap file


def size_class_of(nbytes: int) -> int:
    return max(ALIGN, align_up(nbytes))


@dataclass(frozen=True, slots=True)
class TensorSpec:
    tensor_id: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # "param", "exp_avg", "exp_avg_sq", ...

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize

    @property
    def size_class(self) -> int:
        return size_class_of(self.nbytes)

    def view(self, buf: torch.Tensor) -> torch.Tensor:
        """The tensor as it lives in a raw uint8 buffer slot."""
        return buf[: self.nbytes].view(self.dtype).view(self.shape)


@dataclass(slots=True, eq=False)
class Entry:
    spec: TensorSpec
    home: Tier
    tier: Tier
    fast_class: int = 0  # the fast-tier size class this tensor's buffer comes from
    fast_slot: Slot | None = None
    host_slot: Slot | None = None
    dirty: bool = False  # fast copy newer than home copy
    pins: int = 0  # users that hold the fast copy right now
    pending: Future[tuple[float, Ready]] | None = None  # last I/O job touching this tensor's bytes
    ready: Ready | None = None
    last_use: int = 0
    prefetched: bool = False

    @property
    def permanent(self) -> bool:
        return self.home is Tier.FAST

    @property
    def evictable(self) -> bool:
        return not self.permanent and self.pins == 0 and self.tier in (Tier.FAST, Tier.FETCHING)

    def fast_view(self) -> torch.Tensor:
        assert self.fast_slot is not None, f"{self.spec.tensor_id} has no fast buffer"
        return self.spec.view(self.fast_slot.view)


@dataclass
class Residency:
    """The one owner of every tensor's tier."""

    entries: dict[str, Entry] = field(default_factory=dict)

    def add(self, entry: Entry) -> None:
        self.entries[entry.spec.tensor_id] = entry

    def __getitem__(self, tensor_id: str) -> Entry:
        return self.entries[tensor_id]

    def __contains__(self, tensor_id: object) -> bool:
        return tensor_id in self.entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries.values())

    def move(self, entry: Entry, to: Tier) -> None:
        """Change a tier, refusing transitions that would lose or alias bytes."""
        allowed = {
            Tier.FAST: {Tier.HOST, Tier.NVME},
            Tier.FETCHING: {Tier.FAST},
            Tier.HOST: {Tier.FETCHING, Tier.FAST},
            Tier.NVME: {Tier.FETCHING, Tier.FAST},
        }
        if to not in allowed[entry.tier] or (to in (Tier.HOST, Tier.NVME) and to != entry.home):
            raise AssertionError(f"{entry.spec.tensor_id}: illegal move {entry.tier} -> {to}")
        if to is Tier.FAST and entry.fast_slot is None:
            raise AssertionError(f"{entry.spec.tensor_id}: FAST without a buffer")
        entry.tier = to

    def fast_bytes(self) -> int:
        return sum(e.spec.nbytes for e in self if e.tier in (Tier.FAST, Tier.FETCHING))

    def count(self, tier: Tier) -> int:
        return sum(1 for e in self if e.tier is tier)
