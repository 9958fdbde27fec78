"""Shared by the offload tests: a tiny GPT and a training loop."""

from __future__ import annotations

from collections.abc import Callable

from offload_agent.engine import OffloadEngine
from offload_agent.gpt import GPT, GPTConfig, batch
from shared.offload.planner import build_plan

TINY = GPTConfig(vocab=256, seq=16, layers=2, dim=128, heads=4)
PARAM_BYTES = sum(p.numel() * 4 for p in GPT(TINY).parameters())

MakeEngine = Callable[..., OffloadEngine]


def train(engine: OffloadEngine, steps: int, *, plan: bool = True, start: int = 0) -> list[float]:
    """Run `steps` steps; a tencache engine gets its local plan after warm-up."""
    losses = []
    for step in range(start, start + steps):
        x, y = batch(TINY, 2, step)
        with engine.step():
            loss = engine.model(x, y)
            loss.backward()
        losses.append(float(loss.item()))
        if plan and engine.profile_ready:
            assert engine.apply_plan(build_plan(engine.profile(), engine.budgets)), (
                engine.last_error
            )
    return losses
