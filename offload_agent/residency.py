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
    # computed once: the cache reads it on every access and prefetch
    nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        object.__setattr__(self, "nbytes", n)

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
    # the view `fast_view` last made, and the buffer it is of: made once per fill
    # of a buffer, not at every access (three tensor views each time)
    _view: torch.Tensor | None = field(default=None, repr=False)
    _view_of: Slot | None = field(default=None, repr=False)

    @property
    def permanent(self) -> bool:
        return self.home is Tier.FAST

    @property
    def evictable(self) -> bool:
        return not self.permanent and self.pins == 0 and self.tier in (Tier.FAST, Tier.FETCHING)

    def fast_view(self) -> torch.Tensor:
        slot = self.fast_slot
        assert slot is not None, f"{self.spec.tensor_id} has no fast buffer"
        if self._view_of is not slot or self._view is None:
            self._view, self._view_of = self.spec.view(slot.view), slot
        return self._view


# the moves `Residency.move` allows, from each tier
_ALLOWED = {
    Tier.FAST: frozenset((Tier.HOST, Tier.NVME)),
    Tier.FETCHING: frozenset((Tier.FAST,)),
    Tier.HOST: frozenset((Tier.FETCHING, Tier.FAST)),
    Tier.NVME: frozenset((Tier.FETCHING, Tier.FAST)),
}
_HOMES = (Tier.HOST, Tier.NVME)


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
        if to not in _ALLOWED[entry.tier] or (to in _HOMES and to is not entry.home):
            raise AssertionError(f"{entry.spec.tensor_id}: illegal move {entry.tier} -> {to}")
        if to is Tier.FAST and entry.fast_slot is None:
            raise AssertionError(f"{entry.spec.tensor_id}: FAST without a buffer")
        entry.tier = to

    def fast_bytes(self) -> int:
        return sum(e.spec.nbytes for e in self if e.tier in (Tier.FAST, Tier.FETCHING))

    def count(self, tier: Tier) -> int:
        return sum(1 for e in self if e.tier is tier)
