"""Small pieces on literal inputs: policies, residency moves, slabs, device layer."""

from __future__ import annotations

import itertools

import pytest
import torch

from offload_agent.device import ALIGN, CpuDevice, select_device
from offload_agent.optim import SLICE_ALIGN, AdamW, adamw_step, slices_of
from offload_agent.residency import Entry, Residency, TensorSpec, Tier
from offload_agent.slabs import PoolExhausted, SlabPool
from shared.offload.policies import PREFETCH_AHEAD, LayerOrderPolicy, OnDemandPolicy, PlanPolicy


def test_plan_policy_follows_the_order_and_ranks_by_next_use() -> None:
    """The candidates are the next accesses (one step's worth here: shorter than
    LOOKAHEAD), repeats included; the cache fetches `window` of them that are
    not in the fast tier: the plan's sized lead, or PREFETCH_AHEAD if more."""
    p = PlanPolicy(["a", "b", "c", "a", "d"], window=2)
    assert (p.lead, p.window) == (2, PREFETCH_AHEAD)
    assert PlanPolicy(["a"], window=PREFETCH_AHEAD + 3).window == PREFETCH_AHEAD + 3
    assert list(p.upcoming()) == [("a", 0.0), ("b", 1.0), ("c", 2.0), ("a", 3.0), ("d", 4.0)]
    p.on_use("a", 1)
    p.on_use("b", 2)
    assert list(p.upcoming())[:3] == [("c", 0.0), ("a", 1.0), ("d", 2.0)]
    assert list(p.upcoming())[3:] == [("a", 3.0), ("b", 4.0)]  # into the next step
    assert p.eviction_rank("a", 0) == 1.0  # next use: position 3
    assert p.eviction_rank("b", 0) == 4.0  # next step: 1 + 5 - 2
    assert p.eviction_rank("zzz", 0) == float("inf")  # never used again: first out
    p.on_use("c", 3)
    p.on_use("a", 4)
    p.on_use("d", 5)
    p.on_use("a", 6)  # wrapped into the next step
    assert list(p.upcoming())[:2] == [("b", 0.0), ("c", 1.0)]


def test_layer_order_prefetch_turns_around_in_backward() -> None:
    p = LayerOrderPolicy(["l0", "l1", "l2", "l3"], window=2)
    p.on_use("l0", 1)
    assert [t for t, _ in list(p.upcoming())] == ["l1", "l2"]
    p.on_use("l3", 2)
    p.on_use("l2", 3)
    assert [t for t, _ in list(p.upcoming())] == ["l1", "l0"]
    assert list(OnDemandPolicy().upcoming()) == []


def test_residency_refuses_moves_that_lose_bytes() -> None:
    r = Residency()
    e = Entry(TensorSpec("t", (4,), torch.float32, "param"), home=Tier.NVME, tier=Tier.NVME)
    r.add(e)
    with pytest.raises(AssertionError, match="illegal"):
        r.move(e, Tier.HOST)  # not its home
    with pytest.raises(AssertionError, match="without a buffer"):
        r.move(e, Tier.FAST)


def test_a_tensors_size_and_its_view_in_a_buffer_follow_the_buffer_it_is_in() -> None:
    """`nbytes` (computed once) is what torch allocates for that shape and dtype;
    the view `fast_view` gives (made once per buffer, then reused) always points
    into the buffer the entry holds now, with the tensor's shape and dtype."""
    for shape, dtype in [((3, 5), torch.float32), ((7,), torch.bfloat16), ((), torch.int64),
                         ((2, 0, 4), torch.float16), ((4, 3, 2), torch.float64)]:  # fmt: skip
        assert (
            TensorSpec("t", shape, dtype, "param").nbytes == torch.empty(shape, dtype=dtype).nbytes
        )
    pool = SlabPool("gpu", CpuDevice().alloc_fast, budget=2 * ALIGN)
    pool.build({ALIGN: 2})
    a, b = pool.take(ALIGN), pool.take(ALIGN)
    e = Entry(TensorSpec("t", (8, 4), torch.float32, "param"), home=Tier.HOST, tier=Tier.FAST)
    for slot in (a, b, a, a, b):
        e.fast_slot = slot
        v = e.fast_view()
        assert v.data_ptr() == slot.view.data_ptr(), slot.index
        assert (v.shape, v.dtype) == (torch.Size([8, 4]), torch.float32)
        v.fill_(float(slot.index))
        assert slot.view[:128].view(torch.float32).eq(float(slot.index)).all()
    assert e.fast_view() is e.fast_view()  # the same buffer: the same view, not a new one


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


def test_a_demand_borrows_a_larger_buffer_before_growing_past_the_budget() -> None:
    """One 4 KiB buffer and one 8 KiB buffer; three 4 KiB tensors used at once:
    the second takes the free 8 KiB buffer, the third (nothing left to evict:
    all pinned) gets a buffer past the budget, counted; values stay right."""
    from concurrent.futures import ThreadPoolExecutor

    from offload_agent.cache import TensorCache
    from offload_agent.stats import CacheStats

    dev = CpuDevice()
    fast = SlabPool("gpu", dev.alloc_fast, budget=3 * ALIGN)
    fast.build({ALIGN: 1, 2 * ALIGN: 1})
    host = SlabPool("host", dev.alloc_host, budget=3 * ALIGN)
    host.build({ALIGN: 3})
    specs = [TensorSpec(f"t{i}", (ALIGN // 4,), torch.float32, "param") for i in range(3)]
    stats = CacheStats()
    with ThreadPoolExecutor(1) as io:
        cache = TensorCache(
            device=dev, fast=fast, host=host, store=None, io=io, policy=OnDemandPolicy(),
            stats=stats,
        )  # fmt: skip
        values = [torch.full((ALIGN // 4,), float(i)) for i in range(3)]
        cache.install(
            zip(specs, values, strict=True),
            {s.tensor_id: Tier.HOST for s in specs},
            {s.tensor_id: ALIGN for s in specs},
        )
        views = [cache.use(s.tensor_id) for s in specs]
        sizes = [cache.residency[s.tensor_id].fast_slot.size_class for s in specs]  # type: ignore[union-attr]
        assert sorted(sizes) == [ALIGN, ALIGN, 2 * ALIGN]
        assert fast.overflow_bytes == ALIGN and stats.overflow_bytes == ALIGN
        for i, v in enumerate(views):
            assert torch.equal(v, values[i])
        for s in specs:
            cache.release(s.tensor_id)
        # unpinned now: a fourth use evicts instead of growing again
        assert torch.equal(cache.use("t0"), values[0])
        assert fast.overflow_bytes == ALIGN


def test_emulated_link_queues_copies_and_chains_nvme_then_pcie() -> None:
    """Hand-computed reservations (GB/s = 10^9 B/s; no sleeping here): a link is
    busy until its last reservation ends, copies queue on it in order, an
    NVMe-homed tensor crosses NVMe then PCIe, a write-back goes first and the
    other way, and PCIe's two directions do not wait on each other."""
    from offload_agent.link import Link, LinkEmulation

    link = LinkEmulation(pcie_gbps=2.0, nvme_gbps=0.5)
    mb = 1_000_000
    # host-homed fetch of 2 MB at t=10: PCIe host->fast 1 ms
    assert link.transfer_end(10.0, out_bytes=0, out_nvme=False, in_bytes=2 * mb, in_nvme=False) == (
        pytest.approx(10.001)
    )
    # a second one started at the same time queues behind it
    end = link.transfer_end(10.0, out_bytes=0, out_nvme=False, in_bytes=2 * mb, in_nvme=False)
    assert end == pytest.approx(10.002)
    # NVMe-homed 1 MB at t=20: NVMe 2 ms, then PCIe 0.5 ms
    end = link.transfer_end(20.0, out_bytes=0, out_nvme=False, in_bytes=mb, in_nvme=True)
    assert end == pytest.approx(20.0025)
    # write back 1 MB to NVMe (fast->host 0.5 ms, NVMe 2 ms), then fetch 1 MB from
    # NVMe (2 ms, after the write on the same NVMe link) and PCIe 0.5 ms
    end = link.transfer_end(30.0, out_bytes=mb, out_nvme=True, in_bytes=mb, in_nvme=True)
    assert end == pytest.approx(30.0 + 0.0005 + 0.002 + 0.002 + 0.0005)
    # fast->host holds only the write-back (to 30.0005), not the later host->fast copy
    assert link.d2h.occupy(mb, 30.0) == pytest.approx(30.001)
    # a write-behind alone (no fetch) ends when its write does: host->fast, busy
    # until 30.0045 with the fetch above, is not waited for
    end = link.transfer_end(30.002, out_bytes=mb, out_nvme=False, in_bytes=0, in_nvme=False)
    assert end == pytest.approx(30.0025)
    end = link.transfer_end(40.0, out_bytes=mb, out_nvme=True, in_bytes=0, in_nvme=False)
    assert end == pytest.approx(40.0 + 0.0005 + 0.002)
    # the time reserved on each link, summed (what the bench reports per step):
    # NVMe 1 + 1 + 1 + 1 MB at 0.5 GB/s, host->fast 2 + 2 + 1 + 1 MB at 2 GB/s,
    # fast->host 1 + 1 + 1 + 1 MB (three write-backs and the bare occupy)
    assert link.nvme.busy_s == pytest.approx(4 * 0.002)
    assert link.h2d.busy_s == pytest.approx(0.001 + 0.001 + 0.0005 + 0.0005)
    assert link.d2h.busy_s == pytest.approx(4 * 0.0005)
    with pytest.raises(ValueError, match="not a rate"):
        Link("x", 0.0)


@pytest.mark.parametrize("numel", [2048, 3000, 8192, 262144 * 9, 1_000_003])
@pytest.mark.parametrize("slice_bytes", [4096, 12288, 1 << 20])
def test_state_slices_cover_the_tensor_on_aligned_starts(numel: int, slice_bytes: int) -> None:
    """Slices tile the flattened tensor exactly once, start on multiples of
    SLICE_ALIGN elements, have one length of at most about `slice_bytes`, and
    split / join give the tensor back (the padding is zeros)."""
    cut = slices_of(numel, 4, slice_bytes)
    if numel * 4 <= max(slice_bytes, SLICE_ALIGN * 4):
        assert cut is None
        return
    assert cut is not None and cut.count >= 2
    bounds = cut.bounds()
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(b == a2 for (_a, b), (a2, _b) in itertools.pairwise(bounds))
    assert all(a % SLICE_ALIGN == 0 and b - a <= cut.length for a, b in bounds)
    assert cut.length % SLICE_ALIGN == 0
    assert cut.length * 4 <= max(slice_bytes, SLICE_ALIGN * 4) * 2
    value = torch.randn(numel)
    pieces = cut.split(value)
    assert all(p.shape == (cut.length,) for p in pieces)
    assert torch.equal(cut.join(pieces, (numel,)), value)
    assert not pieces[-1][bounds[-1][1] - bounds[-1][0] :].any()


def test_slice_by_slice_adamw_equals_the_whole_tensor_step() -> None:
    """The elementwise AdamW step over slices of the flattened tensors gives the
    whole-tensor step's bits (and `torch.optim.AdamW`'s), over several steps."""
    torch.manual_seed(0)
    cfg = AdamW(lr=1e-2, weight_decay=0.1)
    p0 = torch.randn(37, 999)
    whole = [p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)]
    cut = slices_of(p0.numel(), 4, 16384)
    assert cut is not None
    sliced_p = p0.clone()
    m_s = [torch.zeros(cut.length) for _ in range(cut.count)]
    v_s = [torch.zeros(cut.length) for _ in range(cut.count)]
    ref = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1, foreach=False)
    for step in range(1, 4):
        g = torch.randn_like(p0)
        adamw_step(cfg, step, whole[0], g, whole[1], whole[2])
        flat_p, flat_g = sliced_p.view(-1), g.reshape(-1)
        for (a, b), m, v in zip(cut.bounds(), m_s, v_s, strict=True):
            adamw_step(cfg, step, flat_p[a:b], flat_g[a:b], m[: b - a], v[: b - a])
        ref.grad = g.clone()
        opt.step()
    assert torch.equal(sliced_p, whole[0]) and torch.equal(ref.detach(), whole[0])
    assert torch.equal(cut.join(m_s, p0.shape), whole[1])
    assert torch.equal(cut.join(v_s, p0.shape), whole[2])
    assert torch.equal(opt.state[ref]["exp_avg_sq"], whole[2])


@pytest.mark.parametrize(
    ("lead_bytes", "want"),
    [(None, 2), (0, 2), (5 * ALIGN, 5), (5 * ALIGN + 1, 6), (100 * ALIGN, 12)],
)  # fmt: skip
def test_the_lead_counts_bytes_past_its_tensors(lead_bytes: int | None, want: int) -> None:
    """Twelve 4 KiB tensors streamed from host, buffers for all: after the first
    access the cache has fetched ahead `window` (2) tensors at least, and past
    those while fewer than `lead_bytes` are ahead; a tensor already fetched and
    the one in use count for nothing."""
    from concurrent.futures import ThreadPoolExecutor

    from offload_agent.cache import TensorCache
    from offload_agent.stats import CacheStats

    n = 13
    dev = CpuDevice()
    fast = SlabPool("gpu", dev.alloc_fast, budget=n * ALIGN)
    fast.build({ALIGN: n})
    host = SlabPool("host", dev.alloc_host, budget=n * ALIGN)
    host.build({ALIGN: n})
    specs = [TensorSpec(f"t{i}", (ALIGN // 4,), torch.float32, "param") for i in range(n)]
    order = [s.tensor_id for s in specs]
    policy = PlanPolicy(order, 2, ahead=2, lead_bytes=lead_bytes)
    with ThreadPoolExecutor(1) as io:
        cache = TensorCache(
            device=dev, fast=fast, host=host, store=None, io=io, policy=policy,
            stats=CacheStats(),
        )  # fmt: skip
        values = [torch.full((ALIGN // 4,), float(i)) for i in range(n)]
        cache.install(
            zip(specs, values, strict=True),
            {s.tensor_id: Tier.HOST for s in specs},
            {s.tensor_id: ALIGN for s in specs},
        )
        assert torch.equal(cache.use("t0"), values[0])
        ahead = [t for t in order[1:] if cache.residency[t].tier is not Tier.HOST]
        assert ahead == order[1 : 1 + want]
        cache.drain()
        for t in order:  # every copy landed whole
            assert torch.equal(cache.use(t), values[int(t[1:])])
            cache.release(t)
