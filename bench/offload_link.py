"""`rltune bench offload_link [--json OUT]`: what the offload engine's CUDA device
layer gets out of the host <-> GPU link, measured side by side in one run.

* **Bandwidth** host -> GPU and GPU -> host per copy size, from pinned host
  buffers through the engine's device layer (`CudaDevice.copy`: a side stream,
  `non_blocking=True`, an event per copy) against a plain pageable
  `tensor.to()` / `.cpu()` (what a loop without pinned buffers gets).
* **Both directions at once**: a prefetch (host -> GPU) and a write-back
  (GPU -> host) together through the engine's device layer (one side stream
  per direction), against both on one stream, as the ratio to the sum of the
  two alone.
* **Overlap with compute**: matrix products on the compute stream alone, the
  engine's copies alone, then both at once; the share of the shorter one
  hidden behind the longer (1.0: fully hidden).
* **Pinning cost**: allocating a pinned buffer against a pageable one.

Times are wall clock around `torch.cuda.synchronize()`, median of `--repeats`.
It needs a CUDA GPU; without one it says so and exits 2.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from offload_agent.device import CudaDevice
from shared.errors import UserError
from shared.jsonfile import write_json

__all__ = ["main"]

MIB = 1 << 20


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rltune bench offload_link", description=__doc__)
    p.add_argument("--sizes-mib", default="1,4,16,64,256", help="copy sizes, MiB")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--overlap-mib", type=int, default=256, help="bytes copied in the overlap test")
    p.add_argument("--matmul", type=int, default=8192, help="side of the bf16 matrix products")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    try:
        a.sizes = [int(x) for x in a.sizes_mib.split(",")]
    except ValueError:
        raise UserError(f"--sizes-mib {a.sizes_mib!r}: give comma-separated integers") from None
    if not a.sizes or min(a.sizes) < 1 or a.repeats < 1:
        raise UserError("--sizes-mib must be positive integers and --repeats >= 1")
    if not torch.cuda.is_available():
        raise UserError("bench offload_link measures a GPU's link: torch.cuda.is_available() "
                        "is False on this machine")  # fmt: skip
    return a


def _timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of `fn` (synchronised before and after), after one warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bandwidth(dev: CudaDevice, mib: int, repeats: int) -> dict[str, float]:
    n = mib * MIB
    pinned, pageable = dev.alloc_host(n), torch.empty(n, dtype=torch.uint8)
    pinned.fill_(1)
    pageable.fill_(1)
    gpu = dev.alloc_fast(n)
    gb = n / 1e9
    out = {
        "h2d_pinned_engine": gb / _timed(lambda: dev.copy(gpu, pinned), repeats),
        "h2d_pageable_plain": gb / _timed(lambda: gpu.copy_(pageable), repeats),
        "d2h_pinned_engine": gb / _timed(lambda: dev.copy(pinned, gpu), repeats),
        "d2h_pageable_plain": gb / _timed(lambda: pageable.copy_(gpu), repeats),
    }
    return {k: round(v, 2) for k, v in out.items()}


def _both_directions(dev: CudaDevice, mib: int, repeats: int) -> dict[str, float]:
    """H2D and D2H of `mib` each: alone, together on one stream, together through
    the engine's `copy` (its two side streams)."""
    n = mib * MIB
    src_h, dst_h = dev.alloc_host(n), dev.alloc_host(n)
    dst_g, src_g = dev.alloc_fast(n), dev.alloc_fast(n)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    one_side = torch.cuda.Stream()

    def h2d(s: Any) -> None:
        with torch.cuda.stream(s):
            dst_g.copy_(src_h, non_blocking=True)

    def d2h(s: Any) -> None:
        with torch.cuda.stream(s):
            dst_h.copy_(src_g, non_blocking=True)

    def together(a: Any, b: Any) -> None:
        h2d(a)
        d2h(b)

    def engine() -> None:
        dev.copy(dst_g, src_h)  # a prefetch, asynchronous
        dev.copy(dst_h, src_g)  # a write-back: returns when the host has the bytes

    alone = _timed(lambda: h2d(streams[0]), repeats) + _timed(lambda: d2h(streams[0]), repeats)
    one = _timed(lambda: together(one_side, one_side), repeats)
    two = _timed(lambda: together(*streams), repeats)
    eng = _timed(engine, repeats)
    return {
        "mib_each_way": mib,
        "sum_alone_ms": round(alone * 1e3, 3),
        "one_stream_ms": round(one * 1e3, 3),
        "two_streams_ms": round(two * 1e3, 3),
        "engine_ms": round(eng * 1e3, 3),
        "one_stream_vs_sum": round(one / alone, 3),
        "two_streams_vs_sum": round(two / alone, 3),
        "engine_vs_sum": round(eng / alone, 3),
    }


def _overlap(dev: CudaDevice, mib: int, side: int, repeats: int) -> dict[str, float]:
    """Matrix products on the compute stream and the engine's H2D copies of `mib`
    (in 16 MiB pieces, as a prefetch of several tensors is), alone and together."""
    a = torch.randn(side, side, device=dev.fast_device, dtype=torch.bfloat16)
    b = torch.randn(side, side, device=dev.fast_device, dtype=torch.bfloat16)
    piece = 16 * MIB
    pieces = max(1, mib * MIB // piece)
    host = [dev.alloc_host(piece) for _ in range(pieces)]
    gpu = [dev.alloc_fast(piece) for _ in range(pieces)]
    copy_s = _timed(lambda: [dev.copy(g, h) for g, h in zip(gpu, host, strict=True)], repeats)
    one_mm = _timed(lambda: a @ b, repeats)
    k = max(1, round(copy_s / one_mm))  # compute about as long as the copies

    def compute() -> None:
        for _ in range(k):
            a @ b

    def both() -> None:
        for g, h in zip(gpu, host, strict=True):
            dev.copy(g, h)  # queued first: the side stream waits for nothing running
        compute()

    # the copies are queued before the products, so the side stream's wait on the
    # compute stream (the engine's guard against refilling a buffer still read)
    # does not serialise them
    comp_s = _timed(compute, repeats)
    both_s = _timed(both, repeats)
    hidden = (comp_s + copy_s - both_s) / min(comp_s, copy_s)
    return {
        "copy_mib": pieces * 16,
        "matmuls": k,
        "compute_ms": round(comp_s * 1e3, 3),
        "copy_ms": round(copy_s * 1e3, 3),
        "together_ms": round(both_s * 1e3, 3),
        "hidden_share": round(max(0.0, min(1.0, hidden)), 3),
    }


def _pinning(dev: CudaDevice, mib: int, repeats: int) -> dict[str, float]:
    n = mib * MIB
    pinned = _timed(lambda: dev.alloc_host(n), repeats)
    plain = _timed(lambda: torch.empty(n, dtype=torch.uint8).fill_(0), repeats)
    return {"mib": mib, "pinned_alloc_ms": round(pinned * 1e3, 3), "pageable_alloc_touch_ms":
            round(plain * 1e3, 3)}  # fmt: skip


def main(argv: list[str]) -> int:
    a = _parse(argv)
    console = Console(stderr=a.json == "-")
    dev = CudaDevice(torch.cuda.current_device())
    name = torch.cuda.get_device_name()
    result: dict[str, Any] = {"gpu": name, "torch": torch.__version__, "cuda": torch.version.cuda}
    with console.status("measuring copy bandwidth"):
        result["bandwidth_gbps"] = {str(m): _bandwidth(dev, m, a.repeats) for m in a.sizes}
    t = Table(title=f"{name}: copy bandwidth, GB/s (median of {a.repeats})")
    for col in ("MiB", "H2D pinned (engine)", "H2D pageable", "D2H pinned (engine)",
                "D2H pageable", "H2D pinned / pageable"):  # fmt: skip
        t.add_column(col, justify="right")
    for m, r in result["bandwidth_gbps"].items():
        t.add_row(
            m,
            f"{r['h2d_pinned_engine']:.1f}",
            f"{r['h2d_pageable_plain']:.1f}",
            f"{r['d2h_pinned_engine']:.1f}",
            f"{r['d2h_pageable_plain']:.1f}",
            f"{r['h2d_pinned_engine'] / r['h2d_pageable_plain']:.2f}x",
        )
    console.print(t)
    with console.status("both directions at once"):
        result["both_directions"] = _both_directions(dev, max(a.sizes), a.repeats)
    bd = result["both_directions"]
    console.print(
        f"H2D + D2H of {bd['mib_each_way']} MiB each: alone {bd['sum_alone_ms']:.2f} ms in sum; "
        f"together on one stream {bd['one_stream_ms']:.2f} ms (x{bd['one_stream_vs_sum']:.2f}), "
        f"on two streams {bd['two_streams_ms']:.2f} ms (x{bd['two_streams_vs_sum']:.2f}), "
        f"through the engine's copy {bd['engine_ms']:.2f} ms (x{bd['engine_vs_sum']:.2f})"
    )
    with console.status("copies beside compute"):
        result["overlap"] = _overlap(dev, a.overlap_mib, a.matmul, a.repeats)
    ov = result["overlap"]
    console.print(
        f"{ov['copy_mib']} MiB of engine copies ({ov['copy_ms']:.2f} ms) beside {ov['matmuls']} "
        f"bf16 {a.matmul}^3 products ({ov['compute_ms']:.2f} ms): together "
        f"{ov['together_ms']:.2f} ms, {ov['hidden_share']:.0%} of the shorter hidden"
    )
    result["pinning"] = _pinning(dev, 64, min(a.repeats, 5))
    pn = result["pinning"]
    console.print(
        f"allocating 64 MiB: pinned {pn['pinned_alloc_ms']:.2f} ms, pageable (and touched) "
        f"{pn['pageable_alloc_touch_ms']:.2f} ms: the engine pins its slabs once at start"
    )
    if a.json:
        write_json(result, a.json)
    return 0
