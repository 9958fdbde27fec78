"""AdamW, one parameter at a time, so it can run the moment that parameter's
gradient is complete (inside backward) with its states fetched just for it.

Same arithmetic as `torch.optim.AdamW(foreach=False)`; every strategy, `none`
included, steps through this one function, so offloading cannot change the
numbers. Like `torch.optim`, each parameter counts its own steps (a parameter
that got no gradient in a step is not stepped and its count stays), and each
belongs to one parameter group with its own learning rate and weight decay.
Gradient clipping follows `torch.nn.utils.clip_grad_norm_` (foreach=False)
operation for operation.

A very large parameter's two states can be cut into slices (`Slices`), each
a tensor of its own in the cache: the step then runs slice by slice over the
flattened parameter and gradient, each slice's states fetched, stepped and
written back on their own, so the states stream through a few small buffers
and the step starts when its first slice arrives (ZeRO-Offload's sub-group
step, at slice granularity). Every operation of the step is elementwise, and
slices start on multiples of 1,024 elements, so the numbers are those of the
whole-tensor step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "GRAD_KIND",
    "SLICE_ALIGN",
    "STATE_KINDS",
    "AdamW",
    "Optimizer",
    "ParamGroup",
    "Slices",
    "adamw_step",
    "clip_coefficient",
    "param_groups",
    "slice_id",
    "slices_of",
    "state_id",
]

STATE_KINDS = ("exp_avg", "exp_avg_sq")
GRAD_KIND = "grad"  # the gradient kept until the step's end (accumulation, clipping)


SLICE_ALIGN = 1024  # elements: every slice starts on a multiple (4 KiB of fp32)


def state_id(param_id: str, kind: str) -> str:
    """The cached tensor id of one of a parameter's states."""
    return f"{param_id}#{kind}"


def slice_id(state: str, k: int) -> str:
    """The cached tensor id of slice `k` of a sliced state (`state_id(...)@k`)."""
    return f"{state}@{k}"


@dataclass(frozen=True, slots=True)
class Slices:
    """How a parameter's states are cut: `count` slices of `length` elements of
    the flattened tensor (`numel` of them; the last slice is padded with zeros
    that no step reads, so every slice has one shape and one size class)."""

    numel: int
    length: int
    count: int

    def bounds(self) -> list[tuple[int, int]]:
        """(start, stop) of each slice in the flattened tensor."""
        return [
            (k * self.length, min((k + 1) * self.length, self.numel)) for k in range(self.count)
        ]

    def split(self, value: torch.Tensor) -> list[torch.Tensor]:
        """A whole state as its slices (copies, the last one zero-padded)."""
        flat = value.reshape(-1)
        out = []
        for a, b in self.bounds():
            piece = torch.zeros(self.length, dtype=value.dtype, device=value.device)
            piece[: b - a].copy_(flat[a:b])
            out.append(piece)
        return out

    def join(self, pieces: Sequence[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
        """The whole state from its slices."""
        flat = torch.cat([p[: b - a] for p, (a, b) in zip(pieces, self.bounds(), strict=True)])
        return flat.view(shape)


def slices_of(numel: int, itemsize: int, slice_bytes: int) -> Slices | None:
    """Equal slices of at most about `slice_bytes` (a multiple of SLICE_ALIGN
    elements), or None when the tensor would be one slice."""
    per = max(SLICE_ALIGN, slice_bytes // itemsize // SLICE_ALIGN * SLICE_ALIGN)
    count = -(-numel // per)
    if count < 2:
        return None
    length = -(-numel // count)
    length = -(-length // SLICE_ALIGN) * SLICE_ALIGN
    return Slices(numel, length, -(-numel // length))


@dataclass(frozen=True, slots=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2


@dataclass(frozen=True, slots=True)
class ParamGroup:
    """Parameters (by name, as `model.named_parameters()` gives them) and their settings."""

    params: tuple[str, ...]
    config: AdamW


def param_groups(model: nn.Module, config: AdamW) -> list[ParamGroup]:
    """The usual two groups: weight decay for matrices, none for norms and biases
    (every parameter with fewer than two dimensions)."""
    named = list(model.named_parameters())
    decay = tuple(n for n, p in named if p.ndim >= 2)
    rest = tuple(n for n, p in named if p.ndim < 2)
    return [
        ParamGroup(decay, config),
        ParamGroup(rest, dataclasses.replace(config, weight_decay=0.0)),
    ]


class Optimizer:
    """Per-parameter settings and step counts: what `torch.optim` keeps beside the
    tensors (the tensors themselves are cached like any other)."""

    def __init__(self, names: Sequence[str], optim: AdamW | Sequence[ParamGroup]) -> None:
        groups = [ParamGroup(tuple(names), optim)] if isinstance(optim, AdamW) else list(optim)
        self.groups = groups
        self.group_of: dict[str, int] = {}
        for i, g in enumerate(groups):
            for n in g.params:
                if n not in names:
                    raise ValueError(f"parameter group {i} names {n!r}, not a model parameter")
                if n in self.group_of:
                    raise ValueError(f"{n} is in parameter groups {self.group_of[n]} and {i}")
                self.group_of[n] = i
        missing = [n for n in names if n not in self.group_of]
        if missing:
            raise ValueError(f"{missing[0]} is in no parameter group ({len(missing)} missing)")
        self.steps: dict[str, int] = {}

    def config(self, name: str) -> AdamW:
        return self.groups[self.group_of[name]].config

    def set_lr(self, lr: float | Iterable[float]) -> None:
        """New learning rate(s), as a scheduler sets `group["lr"]`: one for every
        group, or one per group."""
        lrs = [lr] * len(self.groups) if isinstance(lr, float | int) else list(lr)
        if len(lrs) != len(self.groups):
            raise ValueError(f"{len(lrs)} learning rates for {len(self.groups)} groups")
        self.groups = [
            ParamGroup(g.params, dataclasses.replace(g.config, lr=float(x)))
            for g, x in zip(self.groups, lrs, strict=True)
        ]

    def count(self, name: str) -> int:
        """Parameter `name` takes a step: its count goes up by one and is returned."""
        n = self.steps.get(name, 0) + 1
        self.steps[name] = n
        return n

    def step(
        self, name: str, p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor
    ) -> None:
        """One AdamW step of parameter `name` (its count goes up by one)."""
        adamw_step(self.config(name), self.count(name), p, g, m, v)


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


@torch.no_grad()
def clip_coefficient(norms: Sequence[torch.Tensor], max_norm: float) -> tuple[float, torch.Tensor]:
    """The global 2-norm of the gradients whose own norms are `norms` (in
    parameter order) and the factor `clip_grad_norm_` multiplies them by."""
    total = torch.linalg.vector_norm(torch.stack(list(norms)), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return float(total), coef
