"""The tensor cache: moves tensors between their home (host slab / NVMe file) and
the fast tier, ahead of use when the policy says so, and keeps the books.

Threading: every decision and every `Entry` change happens on the caller's
(training) thread. I/O threads only run `Mover.transfer`, which writes an evicted
tensor back to its home (if it changed) and then fills the freed buffer with
the incoming tensor, in that order, so a buffer is never refilled while its
old bytes are still needed. A tensor is handed to compute only after the
future of the copy into it has finished (and, on CUDA, after compute has been
made to wait on the copy's event).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future

import torch

from offload_agent.device import Device, Ready
from offload_agent.mover import Mover, WriteBack
from offload_agent.nvme import NvmeStore
from offload_agent.residency import Entry, Residency, TensorSpec, Tier
from offload_agent.slabs import PoolExhausted, SlabPool, Slot
from offload_agent.stats import CacheStats
from shared.offload.policies import Policy

__all__ = ["Bind", "TensorCache"]

log = logging.getLogger("rltune.offload")

Bind = Callable[[str, "torch.Tensor | None"], None]

MAX_AHEAD = 64  # most tensors fetched ahead, whatever the lead in bytes
_IN_FAST = (Tier.FAST, Tier.FETCHING)  # tiers in which a tensor holds a fast buffer


def _no_bind(tensor_id: str, view: torch.Tensor | None) -> None:
    return None


class TensorCache:
    def __init__(
        self,
        *,
        device: Device,
        fast: SlabPool,
        host: SlabPool,
        store: NvmeStore | None,
        io: Executor,
        policy: Policy,
        stats: CacheStats,
        bind: Bind = _no_bind,
    ) -> None:
        self.device, self.fast, self.host, self.store = device, fast, host, store
        self.io, self.policy, self.stats, self.bind = io, policy, stats, bind
        self.residency = Residency()
        self.clock = 0
        self._holders: dict[int, set[Entry]] = {}
        self.mover = Mover(device, store, stats)
        self._owners: dict[int, Entry] = {}  # fast slot address -> tensor in it
        # fast slot address -> a write-behind still reading it (the next fill waits)
        self._slot_jobs: dict[int, Future[tuple[float, Ready]]] = {}

    # ---- setup -------------------------------------------------------------

    def install(
        self,
        items: Iterable[tuple[TensorSpec, torch.Tensor]],
        homes: Mapping[str, Tier],
        fast_class: Mapping[str, int],
    ) -> None:
        """Put each tensor's current value at its home; the pools must be built."""
        for spec, data in items:
            home = homes[spec.tensor_id]
            c = fast_class[spec.tensor_id]
            if c < spec.nbytes or not self.fast.capacity(c):
                raise PoolExhausted(f"no fast buffer of {c} B for {spec.tensor_id}")
            entry = Entry(spec, home=home, tier=home, fast_class=c)
            self.residency.add(entry)
            if home is Tier.FAST:
                entry.fast_slot = self.fast.take(entry.fast_class)
                self._owners[entry.fast_slot.address] = entry
                entry.fast_view().copy_(data)
                self._holders.setdefault(entry.fast_class, set()).add(entry)
                self.bind(spec.tensor_id, entry.fast_view())
                continue
            if home is Tier.HOST:
                entry.host_slot = self.host.take(spec.size_class)
                spec.view(entry.host_slot.view).copy_(data)
            else:
                self._write_initial(entry, data)
            self.bind(spec.tensor_id, None)
        self.stats.memory(self.fast.allocated_bytes, self.host.allocated_bytes)

    def _write_initial(self, entry: Entry, data: torch.Tensor) -> None:
        scratch = self.fast.take(entry.fast_class)
        try:
            self.mover.write_initial(entry.spec, scratch, data)
        finally:
            self.fast.give_back(scratch)

    # ---- the training thread's calls ---------------------------------------

    def begin_step(self) -> None:
        self.policy.begin_step()
        self.prefetch()

    def use(self, tensor_id: str) -> torch.Tensor:
        """The tensor, ready in the fast tier, pinned until `release`."""
        entry = self.residency[tensor_id]
        self.clock += 1
        entry.last_use = self.clock
        if entry.tier is Tier.FAST:
            self.stats.access("hit")
        elif entry.tier is Tier.FETCHING:
            assert entry.pending is not None
            self.stats.access("hit" if entry.pending.done() else "late")
        else:
            self.stats.access("miss")
            got = self._slot_for(entry, demand=True, distance=0.0)
            assert got is not None
            self._submit(entry, *got)
        self._settle(entry)
        entry.pins += 1
        self.policy.on_use(tensor_id, self.clock)
        view = entry.fast_view()
        self.bind(tensor_id, view)
        self.prefetch()
        return view

    def owner(self, t: torch.Tensor) -> Entry | None:
        """The cached tensor whose fast buffer `t` points into, if any."""
        slot = self.fast.locate(t.data_ptr())
        entry = self._owners.get(slot.address) if slot is not None else None
        if entry is None or entry.spec.dtype != t.dtype or entry.tier is not Tier.FAST:
            return None
        return entry

    def release(self, tensor_id: str, *, all_pins: bool = False) -> None:
        entry = self.residency[tensor_id]
        entry.pins = 0 if all_pins else max(0, entry.pins - 1)
        if entry.dirty and not entry.pins and self.policy.write_behind(tensor_id):
            self._write_behind(entry)

    def mark_dirty(self, tensor_id: str) -> None:
        """The tensor's fast copy changed (call before `release`)."""
        self.residency[tensor_id].dirty = True

    def prefetch(self) -> None:
        """Start copies for the policy's upcoming tensors while buffers allow: at
        most `policy.window` tensors fetched ahead and not yet used (a tensor
        already in the fast tier is passed over, not counted), in the order
        they are needed; the first that finds no buffer ends the round."""
        ahead: set[str] = set()
        ahead_bytes = 0
        lead_bytes = self.policy.lead_bytes
        for tensor_id, distance in self.policy.upcoming():
            if len(ahead) >= self.policy.window and (
                lead_bytes is None or ahead_bytes >= lead_bytes or len(ahead) >= MAX_AHEAD
            ):
                return
            entry = self.residency.entries.get(tensor_id)
            if entry is None or entry.tier is Tier.FAST or tensor_id in ahead:
                continue
            if entry.tier is not Tier.FETCHING:
                got = self._slot_for(entry, demand=False, distance=distance)
                if got is None:
                    return
                entry.last_use = self.clock  # just fetched: not the next LRU victim
                self._submit(entry, *got)
            ahead.add(tensor_id)
            ahead_bytes += entry.spec.nbytes

    def drain(self) -> None:
        """Wait for every copy in flight (end of a run, before a re-plan)."""
        t0 = time.perf_counter()
        for entry in self.residency:
            if entry.pending is not None:
                entry.pending.result()
            if entry.tier is Tier.FETCHING:
                self._settle(entry)
        self.stats.wait_ms += (time.perf_counter() - t0) * 1e3

    def materialize(self, tensor_id: str) -> torch.Tensor:
        """A CPU copy of the tensor's current value, wherever it is."""
        entry = self.residency[tensor_id]
        if entry.tier in (Tier.FAST, Tier.FETCHING):
            self._settle(entry)
            return entry.fast_view().to("cpu", copy=True)
        if entry.pending is not None:
            entry.pending.result()
        if entry.tier is Tier.HOST:
            assert entry.host_slot is not None
            return entry.spec.view(entry.host_slot.view).clone()
        return self.mover.read_copy(entry.spec)

    def overwrite(self, tensor_id: str, value: torch.Tensor) -> None:
        """Replace the tensor's value wherever it lives (loading a checkpoint);
        nothing may be in flight (`drain` first)."""
        entry = self.residency[tensor_id]
        if entry.tier is Tier.FAST:
            entry.fast_view().copy_(value)
            entry.dirty = not entry.permanent
        elif entry.tier is Tier.HOST:
            assert entry.host_slot is not None
            entry.spec.view(entry.host_slot.view).copy_(value)
        else:
            self.mover.write_copy(entry.spec, value)

    # ---- internals ---------------------------------------------------------

    def _settle(self, entry: Entry) -> None:
        """Wait until the copy into `entry` is done and visible to compute."""
        if entry.tier is Tier.FETCHING:
            assert entry.pending is not None
            if not entry.pending.done():
                t0 = time.perf_counter()
                entry.pending.result()
                self.stats.wait_ms += (time.perf_counter() - t0) * 1e3
            entry.ready = entry.pending.result()[1]
            self.residency.move(entry, Tier.FAST)
        if entry.ready is not None:
            self.device.wait(entry.ready)
            entry.ready = None

    def _slot_for(
        self, entry: Entry, *, demand: bool, distance: float
    ) -> tuple[Slot, WriteBack | None] | None:
        """A fast buffer for `entry`: a free one, or the evicted buffer of the holder
        the policy ranks first. A demand that finds every buffer of its class in use
        borrows a larger one (free, else evicted). A prefetch under a policy that
        protects sooner uses (Belady, 10Cache) takes a free buffer of its class or,
        failing that, of a larger one (the few largest tensors' buffers are idle
        most of the step), else evicts among those the holder needed furthest
        away, and gives up rather than evict a tensor needed sooner than the one
        it would bring in."""
        c = entry.fast_class
        if self.fast.free_count(c):
            return self.fast.take(c), None
        borrow = not demand and self.policy.protect_sooner
        pool = [c, *(b for b in self.fast.classes() if b > c)] if borrow else [c]
        if borrow:
            for b in pool[1:]:  # smallest first
                if self.fast.free_count(b):
                    return self.fast.take(b), None
        victim, furthest = self._victim(pool)
        if victim is None:
            if not demand:
                return None
            return self._borrow(entry)
        if borrow and furthest <= distance:
            return None
        return self._evict(victim)

    def _victim(self, classes: Iterable[int]) -> tuple[Entry | None, float]:
        """The evictable holder of a buffer of these classes that the policy ranks
        first (the first found among equals), and its rank. One pass: this runs
        at every access that finds its prefetch lead short."""
        rank = self.policy.eviction_rank
        best: Entry | None = None
        top = -math.inf
        for b in classes:
            for e in self._holders.get(b, ()):
                if e.pins or e.home is Tier.FAST or e.tier not in _IN_FAST:
                    continue
                r = rank(e.spec.tensor_id, e.last_use)
                if r > top:
                    best, top = e, r
        return best, top

    def _borrow(self, entry: Entry) -> tuple[Slot, WriteBack | None]:
        """A buffer of a larger class for a demand its own class cannot serve; past
        the budget (logged) only when every larger buffer is in use too."""
        c = entry.fast_class
        bigger = [b for b in self.fast.classes() if b > c]
        for b in bigger:  # smallest first
            if self.fast.free_count(b):
                return self.fast.take(b), None
        victim, _rank = self._victim(bigger)
        if victim is not None:
            return self._evict(victim)
        log.warning(
            "fast tier: all %d buffers of %d B (and every larger one) are in use when %s is "
            "needed; adding one past the budget (the step holds more tensors at once than "
            "the layout foresaw)",
            self.fast.capacity(c),
            c,
            entry.spec.tensor_id,
        )
        slot = self.fast.grow(c)
        self.stats.overflow_bytes = self.fast.overflow_bytes
        return slot, None

    def _write_behind(self, entry: Entry) -> None:
        """Copy a changed tensor to its home now; it stays in its buffer, clean. A
        later fill of that buffer waits for this copy (`_evict`), as does a later
        copy of the tensor (`entry.pending`)."""
        if entry.permanent or entry.tier is not Tier.FAST or entry.fast_slot is None:
            return
        write = WriteBack(entry.spec, entry.home, entry.host_slot)
        slot = entry.fast_slot
        entry.pending = self.io.submit(self.mover.write_behind, write, slot, entry.pending)
        entry.dirty = False

    def _evict(self, victim: Entry) -> tuple[Slot, WriteBack | None]:
        self._settle(victim)
        slot = victim.fast_slot
        assert slot is not None
        if victim.pending is not None and not victim.pending.done():
            self._slot_jobs[slot.address] = victim.pending  # a write-behind reads the slot
        write = WriteBack(victim.spec, victim.home, victim.host_slot) if victim.dirty else None
        victim.fast_slot = None
        self._owners.pop(slot.address, None)
        victim.dirty = False
        self._holders[slot.size_class].discard(victim)
        self.residency.move(victim, victim.home)
        self.bind(victim.spec.tensor_id, None)
        return slot, write

    def _submit(self, entry: Entry, slot: Slot, write: WriteBack | None) -> None:
        before = entry.pending  # an earlier write-back of this tensor, if any
        fut = self.io.submit(
            self.mover.transfer,
            entry.spec,
            entry.home,
            entry.host_slot,
            slot,
            write,
            before,
            self._slot_jobs.pop(slot.address, None),
        )
        if write is not None:
            self.residency[write.spec.tensor_id].pending = fut
        entry.fast_slot = slot
        self._owners[slot.address] = entry
        entry.pending = fut
        self._holders.setdefault(slot.size_class, set()).add(entry)
        self.residency.move(entry, Tier.FETCHING)
