"""How far ahead tencache's prefetches start, measured without timing: an I/O
pool whose copies count as finished only `LEAD` accesses after they were
started (a copy takes about as long as the compute of one access). An access
whose copy is not finished by then is late, as on a real link; the hit rate
is then a property of the plan and the prefetch rule alone, deterministic.

ResNet-18's layout (the bench's `resnet`, at half width: the same shapes, a
quarter of the bytes) at a fast tier of 30% of its parameter + AdamW bytes,
host 7%: three convolutions with their states take most of the bytes, so
buffers sized for a lead of one (the plan's `window` there) were all the
prefetch used, and the optimizer states of every streamed parameter, fetched
one access before their use, were late (hit rate about 0.8)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from offload_agent.cache import TensorCache
from offload_agent.device import CpuDevice
from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.models import workload
from offload_agent.mover import Mover
from offload_agent.nvme import NvmeStore
from offload_agent.optim import AdamW
from offload_agent.residency import Tier
from shared.offload.planner import build_plan

LEAD = 2  # accesses between a copy's start and the first access that finds it done


class _LeadFuture(Future[Any]):
    def __init__(self, clock: Callable[[], int], ready_at: int) -> None:
        super().__init__()
        self._clock, self._ready_at = clock, ready_at

    def done(self) -> bool:
        return super().done() and self._clock() >= self._ready_at


class LeadPool(Executor):
    """Runs each copy at once, in order (as one I/O thread would), and reports it
    finished only `lead` accesses later; waiting for it (`result`) never blocks."""

    def __init__(self, lead: int) -> None:
        self.lead = lead
        self.clock: Callable[[], int] = lambda: 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut = _LeadFuture(self.clock, self.clock() + self.lead)
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the waiter, as a pool does
            fut.set_exception(exc)
        return fut


def _resnet(
    strategy: str, job_id: str, root: Path, io: Executor, *, write_behind: bool = False
) -> OffloadEngine:
    """The bench's ResNet-18 under `strategy`, fast tier 30% and host 7% of its
    parameter + AdamW bytes, started."""
    model = workload("resnet", dim=512, layers=4, vocab=2048, seq=0, size=2, seed=0).model
    total = sum(p.numel() * p.element_size() * 3 for p in model.parameters())
    engine = OffloadEngine(
        model,
        AdamW(lr=1e-3),
        EngineConfig(
            job_id=job_id,
            strategy=strategy,
            fast_budget=int(0.3 * total),
            host_budget=int(0.07 * total),
            write_behind=write_behind,
        ),
        device=CpuDevice(),
        store=NvmeStore(root / strategy),
        io=io,
    )
    engine.start()
    return engine


def _train(strategy: str, root: Path, steps: int) -> tuple[OffloadEngine, list[float]]:
    w = workload("resnet", dim=512, layers=4, vocab=2048, seq=0, size=2, seed=0)
    pool = LeadPool(LEAD)
    engine = _resnet(strategy, f"lead-{strategy}", root, pool)
    losses = []
    for step in range(steps):
        if step == 2:
            engine.stats.reset()
        cache = engine.cache
        assert cache is not None
        pool.clock = functools.partial(getattr, cache, "clock")
        with engine.step():
            loss = w.loss(engine.model, step)
            loss.backward()
        losses.append(float(loss.item()))
        if engine.profile_ready:
            assert engine.apply_plan(build_plan(engine.profile(), engine.budgets))
    return engine, losses


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_resnet18_at_30_percent_hits_90_percent_with_a_one_access_copy(tmp_path: Path) -> None:
    torch.manual_seed(0)
    engine, losses = _train("tencache", tmp_path, 4)
    ref, ref_losses = _train("none", tmp_path, 4)
    st = engine.stats
    assert engine.setup_name == "tencache"
    assert losses == ref_losses  # exact: caching changes no number
    assert st.overflow_bytes == 0 and st.peak_fast_bytes <= engine.budgets.fast
    assert st.hit_rate >= 0.90, (st.hits, st.late, st.misses)
    engine.close()
    ref.close()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_write_behind_is_finished_before_its_buffer_is_refilled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write-behind copies a changed optimizer state home while it stays in its
    buffer; the prefetch that later takes that buffer must wait for the copy.
    With every write-behind slowed (it starts 3 ms late, on real I/O threads),
    a fill that did not wait would put the next tensor's bytes in the home
    copy, and the losses and parameters would leave `none`'s. Each changed
    tensor is also written home at most once per step."""
    written: list[str] = []
    slow, submit = Mover.write_behind, TensorCache._write_behind

    def late(self: Mover, write: Any, slot: Any, before: Any) -> Any:
        time.sleep(0.003)
        return slow(self, write, slot, before)

    def counted(self: TensorCache, entry: Any) -> None:
        if entry.tier is Tier.FAST and not entry.permanent:
            written.append(entry.spec.tensor_id)
        submit(self, entry)

    monkeypatch.setattr(Mover, "write_behind", late)
    monkeypatch.setattr(TensorCache, "_write_behind", counted)
    w = workload("resnet", dim=512, layers=4, vocab=2048, seq=0, size=2, seed=0)
    results = {}
    for strategy in ("tencache", "none"):
        with ThreadPoolExecutor(4) as io:
            engine = _resnet(strategy, f"wb-{strategy}", tmp_path, io, write_behind=True)
            losses, per_step = [], []
            for step in range(4):
                written.clear()
                with engine.step():
                    loss = w.loss(engine.model, step)
                    loss.backward()
                per_step.append(list(written))
                losses.append(float(loss.item()))
                if engine.profile_ready:
                    assert engine.apply_plan(build_plan(engine.profile(), engine.budgets))
            results[strategy] = (losses, engine.snapshot(), per_step)
            engine.close()
    losses, snap, per_step = results["tencache"]
    assert losses == results["none"][0]
    for tid, value in results["none"][1].items():
        assert torch.equal(snap[tid], value), tid
    assert all(per_step[2:]), "no write-behind under the plan"
    assert all(len(s) == len(set(s)) for s in per_step)
