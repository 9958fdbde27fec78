"""Moving bytes between tiers: what the I/O threads run.

`transfer` writes the previous occupant of a fast buffer back to its home (when
it changed) and then fills the buffer with the incoming tensor, in that order,
so a buffer is never refilled while its old bytes are still needed. Host
slabs are copied through the device layer; NVMe files go through `NvmeStore`,
straight into the buffer when the fast tier is host memory, else through a
pinned staging buffer (CUDA).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from offload_agent.device import Device, Ready
from offload_agent.nvme import NvmeStore
from offload_agent.residency import TensorSpec, Tier
from offload_agent.slabs import Slot
from offload_agent.stats import CacheStats

__all__ = ["Mover", "WriteBack"]


@dataclass(frozen=True, slots=True)
class WriteBack:
    """An evicted tensor whose fast copy must reach its home first."""

    spec: TensorSpec
    home: Tier
    host_slot: Slot | None


def _meta(spec: TensorSpec) -> str:
    """What a swap file's header says the tensor is, besides its id."""
    return f"{str(spec.dtype).removeprefix('torch.')}{list(spec.shape)}"


class Mover:
    def __init__(self, device: Device, store: NvmeStore | None, stats: CacheStats) -> None:
        self.device, self.store, self.stats = device, store, stats
        self._staging: dict[int, queue.Queue[torch.Tensor]] = {}

    def _store(self) -> NvmeStore:
        if self.store is None:
            raise RuntimeError("a tensor lives on NVMe but no NVMe store is set")
        return self.store

    def add_staging(self, size_class: int, buffers: Sequence[torch.Tensor]) -> None:
        """Pinned host buffers through which NVMe bytes reach a GPU fast tier (CUDA
        only; one per I/O thread is enough). Unused when the fast tier is host memory."""
        q = self._staging.setdefault(size_class, queue.Queue())
        for buf in buffers:
            q.put(buf)

    @contextmanager
    def host_buffer(self, slot: Slot) -> Iterator[torch.Tensor]:
        """A host buffer for file I/O of `slot`: the slot itself when the fast tier is
        host memory, else a pinned staging buffer of the same class."""
        if slot.view.device.type == "cpu":
            yield slot.view
            return
        staging = self._staging[slot.size_class]
        buf = staging.get()
        try:
            yield buf
        finally:
            staging.put(buf)

    def write_initial(self, spec: TensorSpec, scratch: Slot, data: torch.Tensor) -> None:
        with self.host_buffer(scratch) as staged:
            spec.view(staged).copy_(data)
            self._store().write(spec.tensor_id, staged, spec.nbytes, _meta(spec))

    def read_copy(self, spec: TensorSpec) -> torch.Tensor:
        """A fresh CPU copy of a tensor from its swap file (re-plans and checks only)."""
        staged = self.device.alloc_host(spec.size_class)
        self._store().read(spec.tensor_id, staged, spec.nbytes, _meta(spec))
        return spec.view(staged).clone()

    def write_copy(self, spec: TensorSpec, data: torch.Tensor) -> None:
        """Write a tensor's swap file from any CPU tensor (checkpoint loads only)."""
        staged = self.device.alloc_host(spec.size_class)
        spec.view(staged).copy_(data)
        self._store().write(spec.tensor_id, staged, spec.nbytes, _meta(spec))

    def transfer(
        self,
        spec: TensorSpec,
        home: Tier,
        host_slot: Slot | None,
        slot: Slot,
        write: WriteBack | None,
        before: Future[tuple[float, Ready]] | None,
        slot_job: Future[tuple[float, Ready]] | None = None,
    ) -> tuple[float, Ready]:
        """I/O thread: write back the previous occupant of `slot`, then fill it.
        `slot_job` (an early write-back of that occupant still reading the slot)
        and `before` (an earlier write-back of `spec`) were submitted earlier, so
        they are already running or done."""
        if slot_job is not None:
            slot_job.result()
        t0 = time.perf_counter()
        out = 0
        if write is not None:
            out = self.copy_out(write, slot)
        if before is not None:
            before.result()  # submitted earlier, so already running or done
        ready = self.copy_in(spec, home, host_slot, slot)
        self._link_wait(
            t0,
            out_bytes=out,
            out_nvme=write is not None and write.home is Tier.NVME,
            in_bytes=spec.nbytes,
            in_nvme=home is Tier.NVME,
        )
        ms = (time.perf_counter() - t0) * 1e3
        self.stats.migrated(spec.nbytes, out, ms)
        return ms, ready

    def write_behind(
        self, write: WriteBack, slot: Slot, before: Future[tuple[float, Ready]] | None
    ) -> tuple[float, Ready]:
        """I/O thread: copy a changed tensor that stays in `slot` to its home now, so
        the buffer can later be refilled without a write-back first."""
        if before is not None:
            before.result()
        t0 = time.perf_counter()
        out = self.copy_out(write, slot)
        self._link_wait(
            t0, out_bytes=out, out_nvme=write.home is Tier.NVME, in_bytes=0, in_nvme=False
        )
        ms = (time.perf_counter() - t0) * 1e3
        self.stats.migrated(0, out, ms)
        return ms, Ready()

    def _link_wait(
        self, t0: float, *, out_bytes: int, out_nvme: bool, in_bytes: int, in_nvme: bool
    ) -> None:
        """A host-memory fast tier behind an emulated link: a copy started at `t0`
        ends no sooner than the link's queues let it."""
        link = self.device.link
        if link is not None:
            link.wait_until(
                link.transfer_end(
                    t0, out_bytes=out_bytes, out_nvme=out_nvme, in_bytes=in_bytes, in_nvme=in_nvme
                )
            )

    def copy_out(self, write: WriteBack, slot: Slot) -> int:
        if write.home is Tier.HOST:
            assert write.host_slot is not None
            self.device.copy(write.spec.view(write.host_slot.view), write.spec.view(slot.view))
        else:
            with self.host_buffer(slot) as staged:
                if staged is not slot.view:
                    self.device.copy(staged, slot.view)  # GPU -> pinned, synchronous
                self._store().write(
                    write.spec.tensor_id, staged, write.spec.nbytes, _meta(write.spec)
                )
        return write.spec.nbytes

    def copy_in(self, spec: TensorSpec, home: Tier, host_slot: Slot | None, slot: Slot) -> Ready:
        if home is Tier.HOST:
            assert host_slot is not None
            return self.device.copy(spec.view(slot.view), spec.view(host_slot.view))
        with self.host_buffer(slot) as staged:
            self._store().read(spec.tensor_id, staged, spec.nbytes, _meta(spec))
            if staged is slot.view:
                return Ready()
            ready = self.device.copy(spec.view(slot.view), spec.view(staged))
            if ready.event is not None:  # the staging buffer goes back to the queue
                ready.event.synchronize()
            return ready
