"""The engine inside a training loop: numbers unchanged, buffers reused, copies
never read early, bad plans and bad disks survived."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import msgspec
import pytest
import torch
import torch.nn.functional as F

import offload_agent.engine as engine_mod
import offload_agent.optim as optim_mod
from offload_agent.device import ALIGN, CpuDevice
from offload_agent.engine import OffloadEngine
from offload_agent.gpt import GPT, GPTConfig, batch
from offload_agent.link import LinkEmulation
from offload_agent.nvme import NvmeStore, SwapFileError, SwapPathError
from offload_agent.residency import Tier
from offload_agent.stats import CacheStats
from shared.offload.planner import build_plan
from shared.offload.policies import PlanPolicy
from tests.offload_agent.tiny import PARAM_BYTES, TINY, MakeEngine, train

STEPS = 4


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """Losses with everything resident (`none`)."""
    from concurrent.futures import ThreadPoolExecutor

    from offload_agent.engine import EngineConfig, OffloadEngine
    from offload_agent.optim import AdamW

    torch.manual_seed(0)
    with ThreadPoolExecutor(1) as io:
        e = OffloadEngine(
            GPT(TINY),
            AdamW(lr=1e-3),
            EngineConfig(strategy="none"),
            device=CpuDevice(),
            store=None,
            io=io,
        )
        e.start()
        return train(e, STEPS)


@pytest.mark.parametrize("strategy", ["lru", "fixed", "tencache"])
def test_losses_identical_to_none(
    make_engine: MakeEngine, reference: list[float], strategy: str
) -> None:
    engine = make_engine(strategy)
    assert train(engine, STEPS) == reference
    homes = {e.home for e in engine.cache.residency}  # type: ignore[union-attr]
    assert Tier.NVME in homes  # the run really went through swap files


@pytest.mark.parametrize("strategy", ["lru", "fixed", "tencache"])
def test_an_emulated_link_changes_only_time(
    make_engine: MakeEngine, reference: list[float], strategy: str
) -> None:
    """Behind an emulated link (every copy also waits out its bytes at 4 GB/s
    PCIe, 1 GB/s NVMe) the numbers are those of `none`; the copies did run
    through it (the fast->host link was reserved by write-backs)."""
    link = LinkEmulation(pcie_gbps=4.0, nvme_gbps=1.0)
    engine = make_engine(strategy, device=CpuDevice(link=link))
    assert train(engine, STEPS) == reference
    assert link.h2d.busy_until > 0 and link.nvme.busy_until > 0 and link.d2h.busy_until > 0


def torch_adamw(model: type[GPT]) -> tuple[list[float], GPT]:
    """Losses of plain PyTorch training (torch.optim.AdamW), and the trained model."""
    torch.manual_seed(0)
    plain = model(TINY)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-3, weight_decay=1e-2, foreach=False)
    losses = []
    for step in range(STEPS):
        x, y = batch(TINY, 2, step)
        loss = plain(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses, plain


def test_none_matches_torch_adamw(reference: list[float]) -> None:
    losses, _ = torch_adamw(GPT)
    assert losses == pytest.approx(reference, rel=1e-5)


def test_buffers_allocated_once_after_warmup(make_engine: MakeEngine) -> None:
    device = CpuDevice()
    engine = make_engine("tencache", device=device)
    train(engine, 2)  # warm-up, plan applied, one step on the plan
    assert engine.setup_name == "tencache"
    before = device.allocations
    train(engine, 3, start=2)
    assert device.allocations == before


class SlowStore(NvmeStore):
    """Reads take 5 ms, so prefetches are really in flight when compute comes."""

    def read(self, tensor_id: str, buf: torch.Tensor, nbytes: int, meta: str = "") -> None:
        time.sleep(0.005)
        super().read(tensor_id, buf, nbytes, meta)


def _assert_ready(engine: engine_mod.OffloadEngine, tensors: list[torch.Tensor]) -> None:
    cache = engine.cache
    assert cache is not None
    for t in tensors:
        entry = cache.owner(t)
        assert entry is not None, "a cached tensor is used outside its fast buffer"
        assert entry.tier is Tier.FAST
        assert entry.pending is None or entry.pending.done()


def test_no_tensor_used_while_its_copy_is_in_flight(
    make_engine: MakeEngine, tmp_path: Path, reference: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine("tencache", fast=1.2, host=0.0, store=SlowStore(tmp_path / "slow"))
    checked = {"modules": 0, "steps": 0}

    def check_module(module: torch.nn.Module, args: object) -> None:
        _assert_ready(engine, list(module.parameters(recurse=False)))
        checked["modules"] += 1

    for m in engine.model.modules():
        if list(m.parameters(recurse=False)):
            m.register_forward_pre_hook(check_module)  # runs after the engine's own hook

    real_step = optim_mod.adamw_step

    def checked_step(cfg, step, p, g, m, v):  # type: ignore[no-untyped-def]
        _assert_ready(engine, [p, m, v])
        checked["steps"] += 1
        real_step(cfg, step, p, g, m, v)

    monkeypatch.setattr(optim_mod, "adamw_step", checked_step)
    assert train(engine, STEPS) == reference
    assert checked["modules"] > 0 and checked["steps"] > 0
    assert engine.stats.late > 0  # prefetched copies really were still in flight when used


def test_prefetch_starts_every_streamed_fetch_ahead(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same planned run with and without the plan's prefetch: without it every
    streamed access is a miss (fetched on demand); with it none is. Whether a
    prefetched copy has landed by its use (hit) or not yet (late) is the disk's
    and the scheduler's timing, so the split between the two is not asserted."""

    def planned_steps(engine: OffloadEngine) -> CacheStats:
        train(engine, 2)  # warm-up, plan, one step on it
        engine.stats.reset()
        train(engine, 3, start=2)
        return engine.stats

    ahead = planned_steps(make_engine("tencache", fast=1.2, host=0.0))
    monkeypatch.setattr(PlanPolicy, "upcoming", lambda self: [])
    on_demand = planned_steps(make_engine("tencache", fast=1.2, host=0.0))
    assert ahead.accesses == on_demand.accesses
    assert on_demand.late == 0 and on_demand.misses > 0
    assert ahead.misses == 0
    assert ahead.hits + ahead.late == on_demand.hits + on_demand.misses


def test_plan_for_unknown_job_is_refused_and_training_goes_on(
    make_engine: MakeEngine, reference: list[float]
) -> None:
    engine = make_engine("tencache", job_id="job-1")
    losses = train(engine, 1, plan=False)
    plan = build_plan(engine.profile(), engine.budgets)
    foreign = msgspec.structs.replace(plan, job_id="someone-else")
    assert not engine.apply_plan(foreign)
    assert "someone-else" in engine.last_error and "job-1" in engine.last_error
    assert engine.setup_name == "lru"  # the safe default
    losses += train(engine, STEPS - 1, plan=False, start=1)
    assert losses == reference


def test_plan_over_budget_is_refused(make_engine: MakeEngine, reference: list[float]) -> None:
    engine = make_engine("tencache")
    losses = train(engine, 1, plan=False)
    plan = build_plan(engine.profile(), engine.budgets)
    greedy = msgspec.structs.replace(plan, buffers={**plan.buffers, 1 << 30: {"gpu": 4}})
    assert not engine.apply_plan(greedy)
    assert "budget" in engine.last_error
    losses += train(engine, STEPS - 1, plan=False, start=1)
    assert losses == reference


def test_unreadable_nvme_path_falls_back_to_host(
    make_engine: MakeEngine, tmp_path: Path, reference: list[float]
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    engine = make_engine("tencache", store=NvmeStore(blocker / "swap"))
    assert "not usable" in engine.last_error
    losses = train(engine, 1, plan=False)
    plan = build_plan(engine.profile(), engine.budgets)
    assert "nvme" in plan.placement.values()
    assert not engine.apply_plan(plan)
    assert "NVMe tier is unusable" in engine.last_error
    assert engine.last_error.count("not usable") == 1  # the cause, once
    assert not engine.profile_ready  # a loop that plans when ready does not re-plan
    losses += train(engine, STEPS - 1, plan=False, start=1)
    assert losses == reference
    assert all(e.home is not Tier.NVME for e in engine.cache.residency)  # type: ignore[union-attr]


def test_corrupted_swap_file_stops_the_read(make_engine: MakeEngine, tmp_path: Path) -> None:
    store = NvmeStore(tmp_path / "swap")
    engine = make_engine("lru", fast=1.2, host=0.0, store=store)
    train(engine, 1)
    victims = [e for e in engine.cache.residency if e.tier is Tier.NVME]  # type: ignore[union-attr]
    assert victims
    for e in victims:
        with open(store.path(e.spec.tensor_id), "r+b") as f:
            f.seek(ALIGN + e.spec.nbytes // 2)  # inside the payload, past the header
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(SwapFileError):
        train(engine, 1, start=1)


def test_profile_records_forward_backward_and_optimizer(make_engine: MakeEngine) -> None:
    engine = make_engine("tencache")
    train(engine, 1, plan=False)
    profile = engine.profile()
    ids = [t[0] for t in profile.tensors]
    assert len(ids) == len(set(ids)) == 3 * len(list(engine.model.parameters()))
    order = profile.order
    w = "blocks.0.fc.weight"
    assert order.count(w) == 3  # forward, backward (saved for grad input), optimizer
    assert order.index(w) < order.index(f"{w}#exp_avg")
    assert profile.fast_budget_bytes == int(PARAM_BYTES * 1.5)


def test_close_gives_the_trained_parameters_back(make_engine: MakeEngine) -> None:
    engine = make_engine("tencache", fast=1.2, host=0.1)
    train(engine, 3)
    want = engine.snapshot()
    engine.close()
    for name, p in engine.model.named_parameters():
        assert p.device.type == "cpu" and p.is_contiguous()
        assert torch.equal(p.detach(), want[name])


class FunctionallyTiedGPT(GPT):
    """The output layer reads the embedding's weight through `F.linear`, outside
    any module that owns it (Megatron's and many minimal GPTs' weight tying)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__(cfg)
        del self.head

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.tok.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class ModuleTiedGPT(GPT):
    """Tying by sharing the parameter between two modules (nanoGPT, GPT-2)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__(cfg)
        self.head.weight = self.tok.weight


@pytest.mark.parametrize("model", [FunctionallyTiedGPT, ModuleTiedGPT])
@pytest.mark.parametrize("strategy", ["none", "lru", "fixed", "tencache"])
def test_tied_weights_train_as_without_offload(
    make_engine: MakeEngine, model: type[GPT], strategy: str
) -> None:
    want, plain = torch_adamw(model)
    engine = make_engine(strategy, model=model)
    got = train(engine, STEPS)
    assert all(math.isfinite(v) for v in got)  # never the NaN placeholder
    assert got == pytest.approx(want, rel=1e-5)
    assert engine.loose == ({"tok.weight"} if model is FunctionallyTiedGPT else set())
    if strategy != "none":
        homes = {e.home for e in engine.cache.residency}  # type: ignore[union-attr]
        assert Tier.NVME in homes
    trained = dict(plain.named_parameters())
    engine.close()
    for name, p in engine.model.named_parameters():
        torch.testing.assert_close(p.data, trained[name].data, rtol=1e-4, atol=1e-6)


class SometimesGPT(GPT):
    """A layer that only some micro-batches go through (an MoE expert no token
    was routed to): its gradient sum is short of the others'."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__(cfg)
        self.extra = torch.nn.Linear(cfg.dim, cfg.dim)
        self.use_extra = True

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        if self.use_extra:
            x = x + self.extra(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


MICRO = 3


def _micro_batches(model: SometimesGPT, step: int) -> list[torch.Tensor]:
    """The scaled losses of one step's micro-batches, backward already run."""
    out = []
    for i in range(MICRO):
        model.use_extra = i == 0
        x, y = batch(TINY, 2, step * MICRO + i)
        loss = model(x, y) / MICRO
        loss.backward()
        out.append(loss.detach())
    return out


@pytest.fixture(scope="module")
def accumulated_reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """PyTorch's own gradient accumulation: `.grad` summed over the micro-batches."""
    torch.manual_seed(0)
    model = SometimesGPT(TINY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2, foreach=False)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        losses += [float(v) for v in _micro_batches(model, step)]
        opt.step()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("strategy", ["none", "lru", "fixed", "tencache"])
def test_gradient_accumulation_matches_pytorch(
    make_engine: MakeEngine,
    accumulated_reference: tuple[list[float], dict[str, torch.Tensor]],
    strategy: str,
) -> None:
    want, trained = accumulated_reference
    engine = make_engine(strategy, model=SometimesGPT, accumulation_steps=MICRO)
    assert isinstance(engine.model, SometimesGPT)
    got = []
    for step in range(STEPS):
        with engine.step():
            got += [float(v) for v in _micro_batches(engine.model, step)]
        if engine.profile_ready:
            assert engine.apply_plan(build_plan(engine.profile(), engine.budgets))
    assert got == pytest.approx(want, rel=1e-5)
    if strategy != "none":
        homes = {(e.spec.kind, e.home) for e in engine.cache.residency}  # type: ignore[union-attr]
        assert {k for k, _ in homes} == {"param", "exp_avg", "exp_avg_sq", "grad"}
        assert Tier.NVME in {tier for _, tier in homes}
    engine.close()
    for name, p in engine.model.named_parameters():  # `extra` stepped on its partial sum
        torch.testing.assert_close(p.data, trained[name], rtol=1e-4, atol=1e-6)


def test_more_backward_passes_than_accumulation_steps_is_an_error(
    make_engine: MakeEngine,
) -> None:
    engine = make_engine("lru", accumulation_steps=2)
    with pytest.raises(RuntimeError, match="accumulation_steps is 2"), engine.step():
        for step in range(3):
            x, y = batch(TINY, 2, step)
            engine.model(x, y).backward()


def test_a_full_disk_at_start_names_the_path_and_leaves_no_file(
    make_engine: MakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    real = os.pwritev
    calls = {"n": 0}

    def fills_up(fd: int, buffers: list[object], offset: int) -> int:
        calls["n"] += 1
        if calls["n"] > 3:  # a few files fit, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "pwritev", fills_up)
    store = NvmeStore(tmp_path / "full")
    with pytest.raises(SwapPathError, match=r"writing swap file /\S+\.swap"):
        make_engine("lru", fast=1.2, host=0.0, store=store)
    assert calls["n"] > 3
    assert not list((tmp_path / "full").rglob("*")), "no partial file or directory is left"
