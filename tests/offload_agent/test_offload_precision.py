"""Mixed precision against PyTorch: fp32 masters in `torch.optim.AdamW`, bf16 or
fp16 working copies as the model's parameters, the forward under
`torch.autocast`, fp16 through `torch.amp.GradScaler`. Losses, working copies,
masters, both AdamW states, step counts and the loss scale must be identical
after several steps, skipped (inf/NaN) steps included, under every strategy."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.nvme import NvmeStore
from offload_agent.optim import AdamW
from offload_agent.precision import LossScale
from offload_agent.residency import Tier
from offload_agent.strategies import specs_of
from shared.offload.planner import build_plan
from tests.offload_agent.hf import (
    DEVICE,
    Amp,
    Loop,
    amp_reference,
    build,
    data,
    engine_device,
    exact,
    freeze,
    loss_of,
)

pytest.importorskip("transformers")


def make(
    arch: str,
    strategy: str,
    loop: Loop,
    amp: Amp,
    root: Path,
    io: ThreadPoolExecutor,
    *,
    checkpointing: str = "",
    fast: float = 0.45,
    **config: Any,
) -> OffloadEngine:
    model = build(arch, checkpointing=checkpointing)
    freeze(model, loop.frozen)
    keep = loop.micro > 1 or loop.max_grad_norm is not None or amp.dtype == torch.float16
    total = sum(s.size_class for s in specs_of(model, accumulate=keep, working=amp.dtype))
    engine = OffloadEngine(
        model,
        AdamW(lr=loop.lr(0)),
        EngineConfig(
            job_id=f"{arch}-{strategy}-{amp.name}",
            strategy=strategy,
            fast_budget=int(total * fast),
            host_budget=int(total * 0.5),
            accumulation_steps=loop.micro,
            max_grad_norm=loop.max_grad_norm,
            precision=amp.name,
            loss_scale=LossScale(init_scale=amp.init_scale, growth_interval=amp.growth_interval),
            **config,
        ),
        device=engine_device(),
        store=NvmeStore(root / f"swap-{arch}-{strategy}"),
        io=io,
    )
    engine.start()
    return engine


def run(engine: OffloadEngine, loop: Loop, amp: Amp, steps: range | None = None) -> list[float]:
    """The loop of docs/guide/offload.md: autocast forward, `engine.scale(loss).backward()`."""
    losses = []
    for step in steps or range(loop.steps):
        engine.set_lr(loop.lr(step))
        with engine.step():
            for i in range(loop.micro):
                with torch.autocast(DEVICE.type, dtype=amp.dtype):
                    loss = loss_of(engine.model, data(step, i)) / loop.micro
                engine.scale(loss).backward()
                losses.append(float(loss.detach()))
        amp.scales.append(engine.loss_scale)
        if loop.max_grad_norm is not None:
            assert engine.last_grad_norm is not None
            loop.grad_norms.append(engine.last_grad_norm)
        if engine.profile_ready:
            plan = build_plan(engine.profile(), engine.budgets)
            assert engine.apply_plan(plan), engine.last_error
    return losses


def assert_same(
    engine: OffloadEngine,
    model: nn.Module,
    masters: dict[str, nn.Parameter],
    opt: torch.optim.AdamW,
) -> None:
    """Masters, working copies, both AdamW states and step counts equal PyTorch's."""
    state = engine.state_dict()
    working = engine.snapshot()
    for name, p in model.named_parameters():
        assert working[name].dtype == p.dtype, name
        exact(working[name], p.detach(), name)
        if name not in masters:
            assert name not in state["state"]
            exact(state["params"][name], p.detach().float())
            continue
        m = masters[name]
        assert state["params"][name].dtype == torch.float32
        exact(state["params"][name], m.detach(), name)
        ref = opt.state.get(m, {})
        got = state["state"][name]
        assert got["step"] == int(ref.get("step", 0)), name
        for k in ("exp_avg", "exp_avg_sq"):
            want = ref.get(k, torch.zeros_like(m))
            assert got[k].dtype == torch.float32
            exact(got[k], want, f"{name} {k}")


def check(
    arch: str,
    strategy: str,
    loop: Loop,
    amp: Amp,
    tmp_path: Path,
    io: ThreadPoolExecutor,
    *,
    checkpointing: str = "",
    fast: float = 0.45,
    **config: Any,
) -> OffloadEngine:
    ref_amp = Amp(amp.dtype, amp.init_scale, amp.growth_interval)
    ref_loop = Loop(loop.steps, loop.lr, loop.decay_groups, loop.max_grad_norm, loop.micro,
                    loop.frozen)  # fmt: skip
    want, model, masters, opt = amp_reference(arch, ref_loop, ref_amp, checkpointing=checkpointing)
    engine = make(
        arch, strategy, loop, amp, tmp_path, io, checkpointing=checkpointing, fast=fast, **config
    )
    assert run(engine, loop, amp) == want
    assert amp.scales == ref_amp.scales
    assert loop.grad_norms == ref_loop.grad_norms
    assert_same(engine, model, masters, opt)
    if strategy != "none":  # the run really streamed through the slow tiers
        assert Tier.NVME in {e.home for e in engine.cache.residency}  # type: ignore[union-attr]
    return engine


# init_scale 2**18 with growth every clean step: on these models the first
# step overflows in fp16 and is skipped, the next grows the scale, the third
# overflows again: skips and growth within four steps.
SKIPS = Amp(torch.float16, init_scale=2.0**18, growth_interval=1)


@pytest.mark.parametrize(
    ("arch", "strategy"),
    [("gpt2", "lru"), ("gpt2", "fixed"), ("llama", "tencache")],
)
def test_fp16_with_loss_scaling_and_skipped_steps(
    arch: str, strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    amp = Amp(SKIPS.dtype, SKIPS.init_scale, SKIPS.growth_interval)
    engine = check(arch, strategy, Loop(steps=4), amp, tmp_path, io)
    assert engine.skipped_steps >= 1  # an overflow really was skipped
    assert len(set(amp.scales)) > 1  # and the scale moved both ways
    engine.close()


@pytest.mark.parametrize(("arch", "strategy"), [("llama", "tencache"), ("bert", "fixed")])
def test_bf16_steps_inside_backward(
    arch: str, strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    check(arch, strategy, Loop(), Amp(torch.bfloat16), tmp_path, io).close()


@pytest.mark.parametrize("amp", [SKIPS, Amp(torch.bfloat16)], ids=["fp16", "bf16"])
def test_sliced_states_under_mixed_precision(
    amp: Amp, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """Sliced fp32 states (`optim.Slices`) stepped against the fp32 master, slice
    by slice, then rounded into the working copy; fp16 with skipped steps."""
    run_amp = Amp(amp.dtype, amp.init_scale, amp.growth_interval)
    sliced: dict[str, Any] = {"slice_states": True, "slice_bytes": 12288, "slice_above": 16384}
    engine = check("llama", "tencache", Loop(steps=4), run_amp, tmp_path, io, **sliced)
    assert len(engine.sliced) >= 2 and engine.setup_name == "tencache"
    engine.close()


@pytest.mark.parametrize("strategy", ["lru", "tencache"])
def test_fp16_clipping_accumulation_and_checkpointing(
    strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    loop = Loop(steps=3, micro=2, max_grad_norm=0.5)
    amp = Amp(torch.float16, init_scale=2.0**16, growth_interval=1)
    check("llama", strategy, loop, amp, tmp_path, io, checkpointing="non-reentrant").close()
    assert min(loop.grad_norms) > 0.5  # it really clipped


def test_fp16_save_load_continue(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    """Masters, states and the loss scale resume bit-exactly in a fresh engine."""
    loop, amp = Loop(steps=4), Amp(SKIPS.dtype, SKIPS.init_scale, SKIPS.growth_interval)
    ref_amp = Amp(SKIPS.dtype, SKIPS.init_scale, SKIPS.growth_interval)
    want, model, masters, opt = amp_reference("gpt2", Loop(steps=4), ref_amp)
    first = make("gpt2", "tencache", loop, amp, tmp_path / "a", io)
    got = run(first, loop, amp, range(2))
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    first.close()
    fresh = Amp(SKIPS.dtype, init_scale=1.0, growth_interval=SKIPS.growth_interval)
    second = make("gpt2", "lru", loop, fresh, tmp_path / "b", io, fast=0.6)
    second.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    got += run(second, loop, amp, range(2, 4))
    assert got == want
    assert amp.scales == ref_amp.scales
    assert_same(second, model, masters, opt)


def test_close_gives_back_fp32_masters(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    amp = Amp(torch.bfloat16)
    _want, _model, masters, _opt = amp_reference("gpt2", Loop(steps=2), Amp(torch.bfloat16))
    engine = make("gpt2", "lru", Loop(steps=2), amp, tmp_path, io)
    run(engine, Loop(steps=2), amp)
    during = engine.model.state_dict()
    engine.close()
    for name, p in engine.model.named_parameters():
        assert p.dtype == torch.float32
        exact(p.detach(), masters[name].detach())
        exact(during[name], masters[name].detach())


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision 'fp8'"):
        OffloadEngine(
            build("gpt2"),
            AdamW(),
            EngineConfig(precision="fp8"),
            device=engine_device(),
            store=None,
            io=ThreadPoolExecutor(1),
        )
