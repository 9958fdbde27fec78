"""Turning a `Setup` into buffers and a cache, and pointing parameters at them."""

from __future__ import annotations

from concurrent.futures import Executor

import torch
from torch import nn

from offload_agent.cache import Bind, TensorCache
from offload_agent.device import Device
from offload_agent.nvme import NvmeStore
from offload_agent.slabs import SlabPool
from offload_agent.stats import CacheStats
from offload_agent.strategies import Setup
from shared.offload.planner import Budgets

__all__ = ["ParamBinder", "build_cache"]


def build_cache(
    setup: Setup,
    budgets: Budgets,
    *,
    device: Device,
    store: NvmeStore | None,
    io: Executor,
    stats: CacheStats,
    bind: Bind,
) -> TensorCache:
    """Allocate the buffers `setup` asks for (once) and a cache over them."""
    unbounded = setup.name == "none" or (setup.name == "lru" and store is None)
    limit = 1 << 62  # `none` has no budget; the no-NVMe fallback overflows host
    fast = SlabPool("gpu", device.alloc_fast, limit if unbounded else budgets.fast)
    host = SlabPool("host", device.alloc_host, limit if unbounded else budgets.host)
    fast.build(setup.fast_layout)
    host.build(setup.host_layout)
    cache = TensorCache(
        device=device,
        fast=fast,
        host=host,
        store=store,
        io=io,
        policy=setup.policy,
        stats=stats,
        bind=bind,
    )
    if device.fast_device.type != "cpu" and setup.uses_nvme:
        for c in fast.classes():  # pinned staging between NVMe and the GPU, two per class
            cache.mover.add_staging(c, [device.alloc_host(c) for _ in range(2)])
    return cache


class ParamBinder:
    """Points each parameter at its fast buffer while it is there, and at a NaN
    placeholder of the right shape (no memory) while it is not, so an access the
    hooks did not announce shows up in the loss instead of reading stale bytes."""

    def __init__(self, params: dict[str, nn.Parameter]) -> None:
        self.params = params
        self.placeholders: dict[str, torch.Tensor] = {}

    def make_placeholders(self, device: torch.device, dtypes: dict[str, torch.dtype]) -> None:
        """`dtypes`: what each parameter computes in (its working dtype)."""
        self.placeholders = {
            n: torch.full((1,), float("nan"), dtype=dtypes[n], device=device).expand(p.shape)
            for n, p in self.params.items()
        }

    def __call__(self, tensor_id: str, view: torch.Tensor | None) -> None:
        param = self.params.get(tensor_id)
        if param is not None:
            param.data = view if view is not None else self.placeholders[tensor_id]
