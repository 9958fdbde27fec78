"""DeepSpeed ZeRO-3 as two strategies of `rltune bench offload`: `deepspeed`
(ZeRO-Infinity: parameters and optimizer states offloaded to NVMe, in swap
files under the bench's swap folder, through DeepSpeed's `async_io` op) and
`deepspeed-cpu` (ZeRO-Offload style: both offloaded to host memory).

The same model from the same config and seed as the other strategies, the same
batches, fp32 throughout (no `bf16`/`fp16` section), AdamW with the bench's
settings and its two parameter groups (weight decay on matrices only), stepped
by DeepSpeed's own optimizer: with an offloaded optimizer DeepSpeed runs
`DeepSpeedCPUAdam` (a vectorised C++ kernel over fp32 master weights in host
memory) instead of the engine's per-tensor AdamW, so its losses differ from
`none`'s by rounding, which the bench reports rather than hides.

Single process, no launcher: `start_distributed` sets up a world of one
(`gloo` on the CPU, `nccl` on CUDA) on 127.0.0.1 and a free port.

**The fast-tier budget on ZeRO-3's knobs** (`zero3_config`). The other
strategies get `fast_budget` bytes of GPU memory for parameters, gradients and
optimizer states. With both offloaded, ZeRO-3 keeps no optimizer state on the
GPU; what it holds there is gathered parameters, the parameters it keeps
resident, and gradient buckets. In fp32 elements `E = fast_budget // 4`:

* `stage3_max_live_parameters = E / 2`: parameters gathered on the GPU at once;
* `stage3_prefetch_bucket_size = E / 4`: parameters fetched ahead of use;
* `stage3_param_persistence_threshold`: the largest parameter size such that all
  parameters of at most that size together take at most `E / 8` (they stay on
  the GPU, as biases and norms do in the other strategies' plans);
* `reduce_bucket_size = E / 8`: gradients gathered before they go to the host;

so the four add up to `E`. The live-parameter limit is DeepSpeed's soft limit: a
module's parameters are gathered whole even when they exceed it. With NVMe,
parameters pass through `offload_param.buffer_count` pinned host buffers of
`buffer_size` = the largest parameter (as ZeRO-Infinity sizes them, and as the
bench's `fixed` does): enough buffers for the live and prefetched elements
counted in the smallest swapped parameter, plus one module's worth, at least
DeepSpeed's default 5. Optimizer states stream through the optimizer
swapper's 4 buffers of `sub_group_size` elements, sized to fill the host
budget (`host_budget // 16`, at least the largest parameter). `deepspeed-cpu`
keeps all offloaded bytes in host memory: the host budget does not apply.
`aio` is DeepSpeed's documented default (1 MiB blocks, queue depth 8, one
submit per block, overlapped events) with `intra_op_parallelism` = the bench's
I/O threads.

DeepSpeed exposes no fast-tier hit rate and no count of bytes copied, so those
columns are `None` (n/a) for both strategies; their peak GPU memory and host
memory are measured like the others' (`bench.offload`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from offload_agent.optim import AdamW, param_groups
from offload_agent.stats import CacheStats

__all__ = [
    "DEEPSPEED_STRATEGIES",
    "DeepSpeedRun",
    "ZeroKnobs",
    "available",
    "lenient",
    "start_distributed",
    "zero3_config",
    "zero3_knobs",
]

DEEPSPEED_STRATEGIES = ("deepspeed", "deepspeed-cpu")  # NVMe, host memory
DEFAULT_PARAM_BUFFERS = 5  # DeepSpeed's offload_param.buffer_count default
OPTIMIZER_BUFFERS = 4  # DeepSpeed's offload_optimizer.buffer_count default


def available() -> str | None:
    """None when DeepSpeed can be imported, else why not (one line)."""
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return f"DeepSpeed is not importable ({type(exc).__name__}: {exc})"
    return None


@dataclass(frozen=True)
class ZeroKnobs:
    """ZeRO-3's limits (fp32 elements) for one fast-tier budget; see the module doc."""

    max_live: int
    prefetch: int
    persistence: int
    reduce_bucket: int
    buffer_size: int
    buffer_count: int
    sub_group: int


def zero3_knobs(
    numels: Sequence[int], module_params: int, fast_budget: int, host_budget: int
) -> ZeroKnobs:
    """`numels`: every trainable parameter's size; `module_params`: the most
    parameters one module owns directly (gathered together)."""
    if not numels or fast_budget < 4:
        raise ValueError("zero3_knobs: need parameters and a fast budget of at least 4 bytes")
    e = fast_budget // 4
    # the largest size s such that every parameter of at most s elements fits E/8
    persistence = 0
    for size in sorted(set(numels)):
        if sum(n for n in numels if n <= size) > e // 8:
            break
        persistence = size
    swapped = [n for n in numels if n > persistence] or list(numels)
    live, prefetch = max(1, e // 2), max(1, e // 4)
    count = math.ceil((live + prefetch) / min(swapped)) + module_params
    count = max(DEFAULT_PARAM_BUFFERS, min(count, len(swapped)))
    largest = max(numels)
    return ZeroKnobs(
        max_live=live,
        prefetch=prefetch,
        persistence=persistence,
        reduce_bucket=max(1, e // 8),
        buffer_size=largest,
        buffer_count=count,
        sub_group=max(largest, host_budget // (4 * OPTIMIZER_BUFFERS)),
    )


def zero3_config(
    knobs: ZeroKnobs,
    *,
    offload: str,
    batch: int,
    optim: AdamW,
    nvme_path: Path | None,
    io_threads: int,
    pin: bool,
) -> dict[str, Any]:
    """DeepSpeed's config for ZeRO-3 with parameters and optimizer states offloaded
    to `offload` ("nvme" or "cpu"), fp32, AdamW with `optim`'s settings (its
    per-group weight decay comes with the parameter groups)."""
    if offload not in ("nvme", "cpu"):
        raise ValueError(f"offload {offload!r}: choose nvme or cpu")
    if offload == "nvme" and nvme_path is None:
        raise ValueError("offload to nvme needs nvme_path")
    param: dict[str, Any] = {"device": offload, "pin_memory": pin}
    opt: dict[str, Any] = {"device": offload, "pin_memory": pin}
    if offload == "nvme":
        param |= {
            "nvme_path": str(nvme_path),
            "buffer_count": knobs.buffer_count,
            "buffer_size": knobs.buffer_size,
        }
        opt |= {"nvme_path": str(nvme_path), "buffer_count": OPTIMIZER_BUFFERS}
    return {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": optim.lr,
                "betas": list(optim.betas),
                "eps": optim.eps,
                "weight_decay": optim.weight_decay,
            },
        },
        "zero_optimization": {
            "stage": 3,
            "offload_param": param,
            "offload_optimizer": opt,
            "stage3_max_live_parameters": knobs.max_live,
            "stage3_prefetch_bucket_size": knobs.prefetch,
            "stage3_param_persistence_threshold": knobs.persistence,
            "reduce_bucket_size": knobs.reduce_bucket,
            "sub_group_size": knobs.sub_group,
        },
        "aio": {
            "block_size": 1 << 20,
            "queue_depth": 8,
            "intra_op_parallelism": max(1, io_threads),
            "single_submit": False,
            "overlap_events": True,
        },
    }


@contextmanager
def lenient() -> Iterator[None]:
    """Where deterministic kernels are required (`deterministic_cuda`), an op without
    one warns instead of failing while DeepSpeed runs; the engine's steps, outside,
    keep the strict setting (under warnings only, some ops, e.g. memory-efficient
    attention's backward, fall back to their non-deterministic kernels)."""
    strict = (
        torch.are_deterministic_algorithms_enabled()
        and not torch.is_deterministic_algorithms_warn_only_enabled()
    )
    if strict:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        if strict:
            torch.use_deterministic_algorithms(True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_distributed(device: str) -> None:
    """A world of one for DeepSpeed (no launcher): `gloo` on the CPU, `nccl` on CUDA."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)


def _module_params(model: nn.Module) -> int:
    return max(
        (sum(p.requires_grad for p in m.parameters(recurse=False)) for m in model.modules()),
        default=1,
    )


class _Drain:
    def __init__(self, device: str) -> None:
        self.device = device

    def drain(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


@dataclass(frozen=True)
class _Config:
    strategy: str  # what bench.offload's planning hook reads


class DeepSpeedRun:
    """One DeepSpeed ZeRO-3 engine behind what `bench.offload`'s interleaved loop
    calls of an `OffloadEngine`: `model` (the DeepSpeed engine, called like the
    model; the loss's `backward()` runs through its hooks), `step()` (the
    optimizer step at its end, then a device sync), `cache.drain()`, `stats`
    (always empty: DeepSpeed counts no hits or bytes) and `close()`."""

    def __init__(
        self,
        model: nn.Module,
        optim: AdamW,
        *,
        strategy: str,
        fast_budget: int,
        host_budget: int,
        batch: int,
        device: str,
        swap_dir: Path,
        io_threads: int,
    ) -> None:
        if strategy not in DEEPSPEED_STRATEGIES:
            raise ValueError(f"strategy {strategy!r}: choose from {DEEPSPEED_STRATEGIES}")
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        start_distributed(device)
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.knobs = zero3_knobs(
            [p.numel() for p in trainable], _module_params(model), fast_budget, host_budget
        )
        offload = "nvme" if strategy == "deepspeed" else "cpu"
        nvme = swap_dir / strategy
        if offload == "nvme":
            nvme.mkdir(parents=True, exist_ok=True)
        self.ds_config = zero3_config(
            self.knobs,
            offload=offload,
            batch=batch,
            optim=optim,
            nvme_path=nvme,
            io_threads=io_threads,
            pin=device == "cuda",
        )
        named = dict(model.named_parameters())
        groups = [
            {"params": [named[n] for n in g.params], "weight_decay": g.config.weight_decay}
            for g in param_groups(model, optim)
            if g.params
        ]
        with lenient():
            self.engine, *_ = deepspeed.initialize(
                model=model, model_parameters=groups, config=self.ds_config
            )
        self.model: nn.Module = self.engine
        self.config = _Config(strategy)
        self.cache = _Drain(device)
        self.stats = CacheStats()
        self.device = None  # no emulated link
        self.device_name = device

    @contextmanager
    def step(self) -> Iterator[None]:
        with lenient():
            yield
            self.engine.step()
            self.cache.drain()

    def close(self) -> None:
        self.engine.destroy()
