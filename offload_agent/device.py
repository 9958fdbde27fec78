"""The one device layer: the only module that knows whether CUDA exists.

With CUDA the fast tier is GPU memory, host slabs are pinned (page-locked) so
copies can be asynchronous, and copies run on side streams (one per direction)
with `non_blocking=True`, ordered against compute by CUDA events. Without CUDA the
fast tier is ordinary host memory under a byte budget, pinning is a no-op and
a copy is finished when it returns (the copy itself still runs, in an I/O
thread, so it overlaps compute the same way a side stream would).

Every buffer handed out is a flat uint8 tensor whose first byte is aligned to
`ALIGN` bytes, so slots carved from it at multiples of `ALIGN` can be the
target of O_DIRECT reads and writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from offload_agent.link import LinkEmulation

__all__ = [
    "ALIGN",
    "CpuDevice",
    "CudaDevice",
    "Device",
    "Ready",
    "align_up",
    "deterministic_cuda",
    "select_device",
]

ALIGN = 4096  # O_DIRECT needs buffer address, offset and length aligned to the block size


def align_up(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


@dataclass(slots=True)
class Ready:
    """What a finished copy leaves behind: on CUDA the event recorded after it on the
    side stream, which compute must wait on before it reads the destination."""

    event: Any = None


class Device(Protocol):
    """What the engine needs from the hardware."""

    name: str
    fast_device: torch.device
    allocations: int  # slab allocations made so far (tests check it stays flat)
    link: LinkEmulation | None  # transfer times emulated for a host-memory fast tier

    def alloc_fast(self, nbytes: int) -> torch.Tensor: ...

    def alloc_host(self, nbytes: int) -> torch.Tensor: ...

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> Ready: ...

    def wait(self, ready: Ready) -> None: ...

    def synchronize(self) -> None: ...


def _aligned(nbytes: int, *, device: torch.device, pin: bool) -> torch.Tensor:
    """A uint8 tensor of `nbytes` whose start address is ALIGN-aligned.

    One over-allocation of ALIGN bytes, then a view from the first aligned byte:
    this also sidesteps the pinned allocator's rounding of each request up to a
    power of two, because each size class is one such allocation (a slab)."""
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, device=device, pin_memory=pin)
    shift = (-raw.data_ptr()) % ALIGN
    return raw[shift : shift + nbytes]


@dataclass
class CpuDevice:
    """No CUDA: the fast tier is host memory; pinning and streams are no-ops. With
    `link`, the I/O threads' copies also take the wall time of a PCIe / NVMe link
    of those rates (`offload_agent/link.py`), as DMA transfers would."""

    name: str = "cpu"
    fast_device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    allocations: int = 0
    link: LinkEmulation | None = None

    def alloc_fast(self, nbytes: int) -> torch.Tensor:
        self.allocations += 1
        return _aligned(nbytes, device=self.fast_device, pin=False)

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        self.allocations += 1
        return _aligned(nbytes, device=torch.device("cpu"), pin=False)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> Ready:
        dst.copy_(src)
        return Ready()

    def wait(self, ready: Ready) -> None:
        return None

    def synchronize(self) -> None:
        return None


@dataclass
class CudaDevice:
    """GPU fast tier, pinned host slabs, and one side stream per direction: a
    prefetch (host -> GPU) and a write-back (GPU -> host) use different copy
    engines, so on one stream they would wait for each other for nothing
    (`rltune bench offload_link` measures both)."""

    index: int = 0
    name: str = "cuda"
    allocations: int = 0
    link: LinkEmulation | None = field(init=False, default=None)  # the real one
    fast_device: torch.device = field(init=False)
    _streams: dict[str, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.fast_device = torch.device("cuda", self.index)

    def _side(self, direction: str) -> Any:
        stream = self._streams.get(direction)
        if stream is None:  # created on first use, not in the constructor
            stream = self._streams[direction] = torch.cuda.Stream(device=self.fast_device)
        return stream

    @property
    def stream(self) -> Any:
        """The host -> GPU side stream."""
        return self._side("in")

    @property
    def out_stream(self) -> Any:
        """The GPU -> host side stream."""
        return self._side("out")

    def alloc_fast(self, nbytes: int) -> torch.Tensor:
        self.allocations += 1
        return _aligned(nbytes, device=self.fast_device, pin=False)

    def alloc_host(self, nbytes: int) -> torch.Tensor:
        self.allocations += 1
        return _aligned(nbytes, device=torch.device("cpu"), pin=True)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> Ready:
        """Copy on the direction's side stream. The stream first waits for the
        work queued on the compute stream: a buffer being refilled is no longer
        read, and a buffer being written back holds its final bytes (a tensor
        written back was changed by compute, which had waited for its fetch).
        A write-back returns once the host holds the bytes, so a refill of the
        same buffer issued after it cannot overtake it."""
        to_host = dst.device.type == "cpu"
        stream = self.out_stream if to_host else self.stream
        stream.wait_stream(torch.cuda.current_stream(self.fast_device))
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        if to_host:  # GPU -> host: the host must see the bytes now
            event.synchronize()
        return Ready(event)

    def wait(self, ready: Ready) -> None:
        if ready.event is not None:
            torch.cuda.current_stream(self.fast_device).wait_event(ready.event)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.fast_device)


def deterministic_cuda() -> None:
    """Deterministic CUDA kernels (convolutions and embedding backward otherwise
    sum in a varying order), for runs whose losses are compared bit for bit. Call
    it before the first cuBLAS use: cuBLAS reads its workspace setting then."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def select_device(prefer: str = "auto") -> Device:
    """CUDA when present (or asked for), else the host-memory stand-in."""
    if prefer == "cpu":
        return CpuDevice()
    if prefer in ("auto", "cuda") and torch.cuda.is_available():
        return CudaDevice(torch.cuda.current_device())
    if prefer == "cuda":
        raise RuntimeError("CUDA was asked for but torch.cuda.is_available() is False")
    return CpuDevice()
