"""A link's transfer time, emulated, for a fast tier that is host memory.

Without a GPU the fast tier is host memory and a "copy" to it is a memcpy: it
costs CPU next to the compute and almost no wall time, the opposite of a DMA
transfer over PCIe or from an NVMe disk, which takes wall time and no CPU. With
`CpuDevice(link=LinkEmulation(pcie_gbps, nvme_gbps))`, every copy the I/O
threads make during training also waits out its bytes at these rates, sleeping
(wall time, no CPU), so compute can go on meanwhile exactly as far as the copy
was started ahead of use:

* PCIe: one link per direction (host -> fast, fast -> host; PCIe is full duplex);
* NVMe: one link for reads and writes;
* a tensor homed on NVMe crosses NVMe, then PCIe (through a pinned staging
  buffer, as the CUDA path moves it); a write-back goes the other way first
  (it must finish before its buffer is refilled);
* copies queue on each link in the order they reach it (a link is busy until
  its last reservation ends), so four I/O threads share one link's bandwidth
  instead of multiplying it. A copy ends at the later of its real end and its
  link's emulated end.

Setup copies (start, re-plan, checkpoints) are not slowed: they are not part
of a training step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

__all__ = ["Link", "LinkEmulation"]


@dataclass
class Link:
    """One direction of a link of `gbps` GB/s (10^9 bytes per second)."""

    name: str
    gbps: float
    busy_until: float = 0.0
    busy_s: float = 0.0  # seconds reserved so far (what a step's bytes cost here)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.gbps > 0:
            raise ValueError(f"link {self.name}: {self.gbps} GB/s is not a rate")

    def occupy(self, nbytes: int, start: float) -> float:
        """Reserve the link for `nbytes` from `start` or when it is next free; the
        end of the reservation (a `time.perf_counter()` value)."""
        with self._lock:
            begin = max(start, self.busy_until)
            self.busy_until = begin + nbytes / (self.gbps * 1e9)
            self.busy_s += nbytes / (self.gbps * 1e9)
            return self.busy_until


@dataclass
class LinkEmulation:
    pcie_gbps: float
    nvme_gbps: float
    h2d: Link = field(init=False)
    d2h: Link = field(init=False)
    nvme: Link = field(init=False)

    def __post_init__(self) -> None:
        self.h2d = Link("pcie host->fast", self.pcie_gbps)
        self.d2h = Link("pcie fast->host", self.pcie_gbps)
        self.nvme = Link("nvme", self.nvme_gbps)

    def transfer_end(
        self, start: float, *, out_bytes: int, out_nvme: bool, in_bytes: int, in_nvme: bool
    ) -> float:
        """When a transfer begun at `start` ends on the links: the write-back of
        `out_bytes` (fast -> host, then to NVMe if homed there), then the fetch of
        `in_bytes` (from NVMe if homed there, then host -> fast)."""
        t = start
        if out_bytes:
            t = self.d2h.occupy(out_bytes, t)
            if out_nvme:
                t = self.nvme.occupy(out_bytes, t)
        if not in_bytes:  # a write-back alone
            return t
        if in_nvme:
            t = self.nvme.occupy(in_bytes, t)
        return self.h2d.occupy(in_bytes, t)

    @staticmethod
    def wait_until(end: float) -> None:
        left = end - time.perf_counter()
        if left > 0:
            time.sleep(left)
