"""Small pieces on literal inputs: policies, residency moves, slabs, device layer."""

from __future__ import annotations

import pytest
import torch

from offload_agent.device import ALIGN, CpuDevice, select_device
from offload_agent.policies import LayerOrderPolicy, OnDemandPolicy, PlanPolicy
from offload_agent.residency import Entry, Residency, TensorSpec, Tier
from offload_agent.slabs import PoolExhausted, SlabPool


def test_plan_policy_follows_the_order_and_ranks_by_next_use() -> None:
    p = PlanPolicy(["a", "b", "c", "a", "d"], window=2)
    assert p.upcoming() == [("a", 0.0), ("b", 1.0)]
    p.on_use("a", 1)
    p.on_use("b", 2)
    assert p.upcoming() == [("c", 0.0), ("a", 1.0)]
    assert p.eviction_rank("a", 0) == 1.0  # next use: position 3
    assert p.eviction_rank("b", 0) == 4.0  # next step: 1 + 5 - 2
    assert p.eviction_rank("zzz", 0) == float("inf")  # never used again: first out
    p.on_use("c", 3)
    p.on_use("a", 4)
    p.on_use("d", 5)
    p.on_use("a", 6)  # wrapped into the next step
    assert p.upcoming() == [("b", 0.0), ("c", 1.0)]


def test_layer_order_prefetch_turns_around_in_backward() -> None:
    p = LayerOrderPolicy(["l0", "l1", "l2", "l3"], window=2)
    p.on_use("l0", 1)
    assert [t for t, _ in p.upcoming()] == ["l1", "l2"]
    p.on_use("l3", 2)
    p.on_use("l2", 3)
    assert [t for t, _ in p.upcoming()] == ["l1", "l0"]
    assert OnDemandPolicy().upcoming() == []


def test_residency_refuses_moves_that_lose_bytes() -> None:
    r = Residency()
    e = Entry(TensorSpec("t", (4,), torch.float32, "param"), home=Tier.NVME, tier=Tier.NVME)
    r.add(e)
    with pytest.raises(AssertionError, match="illegal"):
        r.move(e, Tier.HOST)  # not its home
    with pytest.raises(AssertionError, match="without a buffer"):
        r.move(e, Tier.FAST)


def test_slabs_one_allocation_per_class_and_budget() -> None:
    dev = CpuDevice()
    pool = SlabPool("gpu", dev.alloc_fast, budget=10 * ALIGN)
    pool.build({ALIGN: 4, 2 * ALIGN: 3})
    assert dev.allocations == 2 and pool.allocated_bytes == 10 * ALIGN
    slots = [pool.take(ALIGN) for _ in range(4)]
    assert all(s.address % ALIGN == 0 for s in slots)
    assert pool.locate(slots[2].address + 100) == slots[2]
    with pytest.raises(PoolExhausted):
        pool.take(ALIGN)
    pool.give_back(slots[0])
    assert pool.take(ALIGN) == slots[0]
    with pytest.raises(ValueError, match="budget"):
        pool.build({ALIGN: 11})


def test_device_layer_without_cuda() -> None:
    dev = select_device()
    assert isinstance(dev, CpuDevice) and dev.fast_device.type == "cpu"
    with pytest.raises(RuntimeError, match="CUDA"):
        select_device("cuda")
    buf = dev.alloc_host(3 * ALIGN)
    assert buf.data_ptr() % ALIGN == 0 and buf.numel() == 3 * ALIGN
