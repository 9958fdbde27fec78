"""AdamW, one parameter at a time, so it can run the moment that parameter's
gradient is complete (inside backward) with its states fetched just for it.

Same arithmetic as `torch.optim.AdamW(foreach=False)`; every strategy, `none`
included, steps through this one function, so offloading cannot change the
numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["GRAD_KIND", "STATE_KINDS", "AdamW", "adamw_step", "state_id"]

STATE_KINDS = ("exp_avg", "exp_avg_sq")
GRAD_KIND = "grad"  # the gradient summed over micro-batches (accumulation_steps > 1)


def state_id(param_id: str, kind: str) -> str:
    """The cached tensor id of one of a parameter's states."""
    return f"{param_id}#{kind}"


@dataclass(frozen=True, slots=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2


@torch.no_grad()
def adamw_step(
    cfg: AdamW,
    step: int,
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
) -> None:
    """One in-place AdamW update of `param` (step counts from 1)."""
    beta1, beta2 = cfg.betas
    param.mul_(1 - cfg.lr * cfg.weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = math.sqrt(1 - beta2**step)
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(cfg.eps)
    param.addcdiv_(exp_avg, denom, value=-cfg.lr / bias_correction1)
