"""The engine on Hugging Face models built from configs, against plain PyTorch:
losses, every parameter and every optimizer state after several steps, under
every strategy, with what training loops do (activation checkpointing, a
reused block, tied weights, frozen parameters, clipping, accumulation,
schedules and parameter groups, save / load / continue)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.nvme import NvmeStore
from offload_agent.optim import AdamW, param_groups
from offload_agent.residency import Tier
from offload_agent.strategies import specs_of
from shared.offload.planner import build_plan
from tests.offload_agent.hf import (
    DEVICE,
    Loop,
    build,
    data,
    engine_device,
    exact,
    freeze,
    loss_of,
    torch_reference,
)

pytest.importorskip("transformers")

STRATEGIES = ["none", "lru", "fixed", "tencache"]


def make(
    arch: str,
    strategy: str,
    loop: Loop,
    root: Path,
    io: ThreadPoolExecutor,
    *,
    checkpointing: str = "",
    fast: float = 0.45,
    **config: Any,
) -> OffloadEngine:
    """An engine whose fast tier holds `fast` of the buffer bytes of parameters and
    states, host memory half, the rest (a few tensors: swap files are slow) on NVMe.
    `config`: further `EngineConfig` fields."""
    model = build(arch, checkpointing=checkpointing)
    freeze(model, loop.frozen)
    keep = loop.micro > 1 or loop.max_grad_norm is not None
    total = sum(s.size_class for s in specs_of(model, accumulate=keep))
    base = AdamW(lr=loop.lr(0))
    engine = OffloadEngine(
        model,
        param_groups(model, base) if loop.decay_groups else base,
        EngineConfig(
            job_id=f"{arch}-{strategy}",
            strategy=strategy,
            fast_budget=int(total * fast),
            host_budget=int(total * 0.5),
            accumulation_steps=loop.micro,
            max_grad_norm=loop.max_grad_norm,
            **config,
        ),
        device=engine_device(),
        store=NvmeStore(root / f"swap-{arch}-{strategy}"),
        io=io,
    )
    engine.start()
    return engine


def run(engine: OffloadEngine, loop: Loop, steps: range | None = None) -> list[float]:
    losses = []
    for step in steps or range(loop.steps):
        engine.set_lr(loop.lr(step))
        with engine.step():
            for i in range(loop.micro):
                loss = loss_of(engine.model, data(step, i)) / loop.micro
                loss.backward()
                losses.append(float(loss.detach()))
        if loop.max_grad_norm is not None:
            assert engine.last_grad_norm is not None
            loop.grad_norms.append(engine.last_grad_norm)
        if engine.profile_ready:
            assert engine.apply_plan(build_plan(engine.profile(), engine.budgets)), (
                engine.last_error
            )
    return losses


def assert_same_training(engine: OffloadEngine, model: nn.Module, opt: torch.optim.AdamW) -> None:
    """Every parameter and both AdamW states (and step counts) equal PyTorch's."""
    state = engine.state_dict()
    named = dict(model.named_parameters())
    assert set(state["params"]) == set(named)
    for name, p in named.items():
        exact(state["params"][name], p.detach(), name)
        if not p.requires_grad:
            assert name not in state["state"]
            continue
        ref = opt.state.get(p, {})
        got = state["state"][name]
        assert got["step"] == int(ref.get("step", 0)), name
        for k in ("exp_avg", "exp_avg_sq"):
            want = ref.get(k, torch.zeros_like(p))
            exact(got[k], want, f"{name} {k}")


def check(
    arch: str,
    strategy: str,
    loop: Loop,
    tmp_path: Path,
    io: ThreadPoolExecutor,
    *,
    checkpointing: str = "",
    fast: float = 0.45,
    **config: Any,
) -> OffloadEngine:
    want, model, opt = torch_reference(arch, loop, checkpointing=checkpointing)
    engine = make(
        arch, strategy, loop, tmp_path, io, checkpointing=checkpointing, fast=fast, **config
    )
    got = run(engine, loop)
    assert got == want
    assert_same_training(engine, model, opt)
    if strategy != "none":  # the run really streamed through the slow tiers
        assert Tier.NVME in {e.home for e in engine.cache.residency}  # type: ignore[union-attr]
    return engine


@pytest.mark.parametrize(
    ("arch", "strategy"),
    [(a, s) for a in ("gpt2", "llama") for s in STRATEGIES[1:]]
    + [(a, s) for a in ("bert", "t5", "albert", "resnet") for s in ("lru", "tencache")]
    + [("qwen2", "tencache"), ("vit", "tencache")],
)
def test_trains_exactly_as_torch_adamw(
    arch: str, strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    engine = check(arch, strategy, Loop(), tmp_path, io)
    engine.close()


@pytest.mark.parametrize(
    ("arch", "strategy"),
    [("llama", "lru"), ("llama", "tencache"), ("shared", "lru"), ("shared", "fixed"),
     ("shared", "tencache")],
)  # fmt: skip
def test_non_reentrant_activation_checkpointing(
    arch: str, strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """What `gradient_checkpointing_enable()` uses by default; the shared-block
    model recomputes its one block three times in backward."""
    fast = 0.25 if arch == "llama" else 0.45  # tight enough that buffers are refilled
    check(arch, strategy, Loop(), tmp_path, io, checkpointing="non-reentrant", fast=fast).close()


@pytest.mark.parametrize("strategy", ["fixed", "tencache"])
def test_reentrant_activation_checkpointing(
    strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    check("llama", strategy, Loop(), tmp_path, io, checkpointing="reentrant", fast=0.25).close()


def test_reused_block_under_reentrant_checkpointing_needs_summed_gradients(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """Each recomputed use of the shared block runs its own inner backward, so its
    parameters get three gradients per step: refused by name when the engine
    steps on each gradient, exact when it keeps and sums them (clipping)."""
    engine = make("shared", "lru", Loop(), tmp_path, io, checkpointing="reentrant")
    with pytest.raises(RuntimeError, match=r"block\.\S+ got a second gradient.*use_reentrant"):
        run(engine, Loop(steps=1))
    loop = Loop(max_grad_norm=1e3)
    check("shared", "tencache", loop, tmp_path / "sum", io, checkpointing="reentrant")


@pytest.mark.parametrize("strategy", ["none", "lru", "tencache"])
def test_clipping_schedule_and_groups(
    strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """Clipping by the global norm (small enough that it clips), a warm-up
    schedule, and no weight decay for norms and biases."""
    loop = Loop(steps=3, lr=lambda s: 1e-3 * (s + 1) / 3, decay_groups=True, max_grad_norm=0.5)
    ref = Loop(steps=3, lr=loop.lr, decay_groups=True, max_grad_norm=0.5)
    want, model, opt = torch_reference("llama", ref)
    engine = make("llama", strategy, loop, tmp_path, io)
    assert run(engine, loop) == want
    assert loop.grad_norms == ref.grad_norms
    assert min(ref.grad_norms) > 0.5  # it really clipped
    assert_same_training(engine, model, opt)


@pytest.mark.parametrize("strategy", ["fixed", "tencache"])
def test_clipping_with_accumulation(strategy: str, tmp_path: Path, io: ThreadPoolExecutor) -> None:
    loop = Loop(micro=2, max_grad_norm=0.5)
    check("gpt2", strategy, loop, tmp_path, io).close()


@pytest.mark.parametrize("strategy", ["fixed", "tencache"])
def test_frozen_parameters(strategy: str, tmp_path: Path, io: ThreadPoolExecutor) -> None:
    """Frozen embeddings and a frozen norm: never stepped, still streamed."""
    loop = Loop(frozen=("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"))
    check("llama", strategy, loop, tmp_path, io).close()


@pytest.mark.parametrize("strategy", ["lru", "tencache"])
def test_save_load_continue_is_bit_exact(
    strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """Two steps, `torch.save` of the state, a fresh engine (another strategy and
    budget) loads it and runs two more: the same as four steps in one go."""
    loop = Loop(steps=4, lr=lambda s: 1e-3 / (s + 1), decay_groups=True)
    want, model, opt = torch_reference("gpt2", loop)
    first = make("gpt2", strategy, loop, tmp_path / "a", io)
    got = run(first, loop, range(2))
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    first.close()
    other = "fixed" if strategy == "lru" else "lru"
    second = make("gpt2", other, loop, tmp_path / "b", io, fast=0.6)
    second.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    got += run(second, loop, range(2, 4))
    assert got == want
    assert_same_training(second, model, opt)


@pytest.mark.parametrize("strategy", ["lru", "tencache"])
def test_resnet_starts_on_a_third_of_its_bytes(
    strategy: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """No fast-tier floor per tensor size: ResNet-18's layout (7 size classes at
    these widths) starts with 30% of its parameter and state bytes in the fast
    tier and trains exactly; a floor of 3-4 buffers per class alone needed 36%
    here (46% of the full ResNet-18: 1.38x its parameter bytes). `lru` has no
    floor per class, `tencache`'s plan merges classes until its floors fit."""
    engine = check("resnet", strategy, Loop(), tmp_path, io, fast=0.3)
    if strategy == "tencache":
        assert engine.setup_name == "tencache"  # the plan was applied, not refused
    engine.close()


def test_model_state_dict_during_training_holds_real_values(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    _want, model, _opt = torch_reference("gpt2", Loop(steps=2))
    engine = make("gpt2", "tencache", Loop(steps=2), tmp_path, io)
    run(engine, Loop(steps=2))
    got = engine.model.state_dict()
    ref = model.state_dict()
    assert set(got) == set(ref)  # both names of the tied weight, and the buffers
    for k, v in ref.items():
        exact(got[k], v, k)


def test_evaluation_inside_a_step_changes_nothing(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    """A no-grad forward inside `engine.step()` is no training step: it records no
    profile and counts no optimizer step."""
    want, model, opt = torch_reference("llama", Loop())
    engine = make("llama", "tencache", Loop(), tmp_path, io)
    with torch.no_grad(), engine.step():
        loss_of(engine.model, data(99))
    assert not engine.profile_ready
    assert run(engine, Loop()) == want
    assert_same_training(engine, model, opt)


def test_forward_or_backward_outside_a_step_is_an_error(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    engine = make("gpt2", "lru", Loop(), tmp_path, io)
    before = engine.state_dict()
    with pytest.raises(RuntimeError, match=r"transformer\.\S+ is used outside `with engine.step"):
        loss_of(engine.model, data(0))
    with engine.step():
        loss = loss_of(engine.model, data(0))
    with pytest.raises(RuntimeError, match=r"outside `with engine\.step"):
        loss.backward()
    after = engine.state_dict()
    for name, value in before["params"].items():  # nothing was stepped or poisoned
        assert torch.equal(after["params"][name], value), name
        assert torch.isfinite(after["params"][name]).all()


# States of every parameter over 16 KiB (the 64x128 matrices, the embedding and
# head) cut into slices of 3,072 elements: three per state, the last padded.
SLICED: dict[str, Any] = {"slice_states": True, "slice_bytes": 12288, "slice_above": 16384}


@pytest.mark.parametrize(
    ("arch", "strategy", "checkpointing"),
    [("gpt2", "tencache", ""), ("llama", "tencache", "non-reentrant"), ("llama", "lru", ""),
     ("resnet", "tencache", "")],
)  # fmt: skip
def test_sliced_optimizer_states_train_exactly(
    arch: str, strategy: str, checkpointing: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """The slice-by-slice AdamW step (`optim.Slices`) gives PyTorch's numbers:
    the states stream through the cache as slices (and, under `tencache`, the
    plan sizes buffer classes that hold only parameters)."""
    engine = check(
        arch, strategy, Loop(), tmp_path, io, checkpointing=checkpointing, fast=0.3, **SLICED
    )
    assert len(engine.sliced) >= 2
    ids = {e.spec.tensor_id for e in engine.cache.residency}  # type: ignore[union-attr]
    name, cut = next(iter(engine.sliced.items()))
    assert f"{name}#exp_avg" not in ids and f"{name}#exp_avg@{cut.count - 1}" in ids
    if strategy == "tencache":
        assert engine.setup_name == "tencache"
    engine.close()


def test_sliced_states_with_clipping_accumulation_and_resume(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """Kept gradients stepped at the step's end, slice by slice; the checkpoint
    holds whole states and loads into an engine that does not slice, and back."""
    loop = Loop(steps=4, micro=2, max_grad_norm=0.5, decay_groups=True)
    want, model, opt = torch_reference("llama", loop)
    first = make("llama", "tencache", loop, tmp_path / "a", io, fast=0.3, **SLICED)
    got = run(first, loop, range(2))
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    first.close()
    second = make("llama", "lru", loop, tmp_path / "b", io, fast=0.6)
    second.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    got += run(second, loop, range(2, 3))
    torch.save(second.state_dict(), tmp_path / "ckpt2.pt")
    second.close()
    third = make("llama", "tencache", loop, tmp_path / "c", io, fast=0.3, **SLICED)
    third.load_state_dict(torch.load(tmp_path / "ckpt2.pt"))
    got += run(third, loop, range(3, 4))
    assert got == want
    assert_same_training(third, model, opt)
    third.close()


class _Named(nn.Module):
    """Parameters whose names hold the characters of state and slice ids ('#', '@'),
    as `register_parameter` (or an `nn.ParameterDict` key) allows."""

    names = ("w@0", "v#exp_avg@1")

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        for name in self.names:
            self.register_parameter(name, nn.Parameter(torch.randn(64, 128, generator=g)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, v = (getattr(self, n) for n in self.names)
        return (x @ w @ v.T).square().mean()


@pytest.mark.parametrize("sliced", [False, True])
def test_state_dict_round_trip_of_parameters_named_like_slices(
    sliced: bool, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """A checkpoint of a model whose parameter names look like slice ids loads into
    a fresh engine and resumes with the same numbers as one that never stopped."""
    config = SLICED if sliced else {}
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def engine(tag: str) -> OffloadEngine:
        e = OffloadEngine(
            _Named(),
            AdamW(lr=1e-2),
            EngineConfig(
                job_id=tag, strategy="lru", fast_budget=1 << 20, host_budget=1 << 20, **config
            ),
            device=engine_device(),
            store=NvmeStore(tmp_path / tag),
            io=io,
        )
        e.start()
        return e

    def step(e: OffloadEngine) -> float:
        with e.step():
            loss = e.model(x)
            loss.backward()
        return float(loss.detach())

    first, straight = engine("first"), engine("straight")
    assert bool(first.sliced) is sliced
    assert [step(first) for _ in range(2)] == [step(straight) for _ in range(2)]
    ckpt = first.state_dict()
    first.close()
    second = engine("second")
    second.load_state_dict(ckpt)
    assert step(second) == step(straight)
    for name, value in straight.state_dict()["params"].items():
        exact(second.state_dict()["params"][name], value, name)
    second.close()
    straight.close()
