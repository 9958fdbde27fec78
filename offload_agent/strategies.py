"""The four strategies as one shape, `Setup`: buffer layouts per tier, each tensor's
home, and the prefetch/eviction policy. Same engine, same hooks, same optimizer
for all of them, so the comparison is about caching only.

* `none`: everything resident in the fast tier (no budget): the reference.
* `lru`: naive offload and the engine's safe default. Homes fill the host
  budget in first-use order, the rest goes to NVMe; the fast tier is a cache
  with buffers per size class in proportion to the bytes of that class; fetch
  on demand, evict the least recently used.
* `fixed`: ZeRO-Infinity's scheme: `buffer_count` x `buffer_size` equal
  buffers (`buffer_size` = the largest tensor), parameters on NVMe with one
  swap file per tensor, optimizer states in host memory while the host budget
  lasts (then NVMe), prefetch the next `window` parameters in layer order, LRU.
* `tencache`: whatever the profiler's `PrefetchPlan` says (`from_plan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from offload_agent.optim import GRAD_KIND, STATE_KINDS, Slices, slice_id, slices_of, state_id
from offload_agent.precision import MASTER_KIND
from offload_agent.residency import TensorSpec, Tier
from shared.messages import PrefetchPlan
from shared.offload.planner import Budgets, buffer_classes, lru_layout, step_group
from shared.offload.policies import LayerOrderPolicy, OnDemandPolicy, PlanPolicy, Policy

__all__ = [
    "STRATEGIES",
    "Setup",
    "fixed_setup",
    "from_plan",
    "initial_setup",
    "lru_setup",
    "none_setup",
    "safe_setup",
    "sliced_states",
    "specs_of",
]

STRATEGIES = ("none", "lru", "fixed", "tencache")
_TIER = {"gpu": Tier.FAST, "host": Tier.HOST, "nvme": Tier.NVME}


@dataclass(frozen=True)
class Setup:
    name: str
    fast_layout: dict[int, int]
    host_layout: dict[int, int]
    homes: dict[str, Tier]
    policy: Policy
    fast_class: dict[str, int]  # the fast buffer class each tensor uses

    @property
    def uses_nvme(self) -> bool:
        return any(t is Tier.NVME for t in self.homes.values())


def none_setup(specs: Sequence[TensorSpec]) -> Setup:
    layout: dict[int, int] = {}
    for s in specs:
        layout[s.size_class] = layout.get(s.size_class, 0) + 1
    homes = {s.tensor_id: Tier.FAST for s in specs}
    return Setup("none", layout, {}, homes, OnDemandPolicy(), _own(specs))


def _own(specs: Sequence[TensorSpec]) -> dict[str, int]:
    return {s.tensor_id: s.size_class for s in specs}


def _fill_homes(
    specs: Sequence[TensorSpec], host_budget: int
) -> tuple[dict[str, Tier], dict[int, int]]:
    homes: dict[str, Tier] = {}
    host: dict[int, int] = {}
    left = host_budget
    for s in specs:
        if s.size_class <= left:
            homes[s.tensor_id] = Tier.HOST
            host[s.size_class] = host.get(s.size_class, 0) + 1
            left -= s.size_class
        else:
            homes[s.tensor_id] = Tier.NVME
    return homes, host


def lru_setup(specs: Sequence[TensorSpec], budgets: Budgets) -> Setup:
    """Fast buffers per class in proportion to that class's bytes (`lru_layout`:
    no floor per class), homes host-then-NVMe in the given (first-use) order."""
    group = step_group(s.kind for s in specs)
    layout, serve = lru_layout([s.size_class for s in specs], budgets.fast, group)
    homes, host = _fill_homes(specs, budgets.host)
    classes = {s.tensor_id: serve[s.size_class] for s in specs}
    return Setup("lru", layout, host, homes, OnDemandPolicy(), classes)


def fixed_setup(
    specs: Sequence[TensorSpec], layer_order: Sequence[str], budgets: Budgets, window: int = 4
) -> Setup:
    buffer_size = max(s.size_class for s in specs)
    buffer_count = budgets.fast // buffer_size
    in_use = step_group(s.kind for s in specs) + 1  # one held by backward
    if buffer_count < in_use:
        raise ValueError(
            f"fixed: fast budget {budgets.fast} B holds {buffer_count} buffers of {buffer_size} B"
        )
    params = [s for s in specs if s.kind == "param"]
    states = [s for s in specs if s.kind != "param"]
    homes, host = _fill_homes(states, budgets.host)
    homes.update({s.tensor_id: Tier.NVME for s in params})
    window = min(window, buffer_count - in_use)
    policy = LayerOrderPolicy(layer_order, window)
    one = {s.tensor_id: buffer_size for s in specs}
    return Setup("fixed", {buffer_size: buffer_count}, host, homes, policy, one)


def from_plan(
    plan: PrefetchPlan,
    specs: Sequence[TensorSpec],
    *,
    write_behind: bool = False,
    lead_bytes: int | None = None,
) -> Setup:
    fast = {c: t.get("gpu", 0) for c, t in plan.buffers.items() if t.get("gpu", 0)}
    host = {c: t.get("host", 0) for c, t in plan.buffers.items() if t.get("host", 0)}
    homes = {tid: _TIER[tier] for tid, tier in plan.placement.items()}
    classes = buffer_classes(plan, {s.tensor_id: s.nbytes for s in specs})
    policy = PlanPolicy(
        plan.prefetch, plan.window, write_behind=write_behind, lead_bytes=lead_bytes
    )
    return Setup("tencache", fast, host, homes, policy, classes)


def sliced_states(model: nn.Module, *, slice_bytes: int, above: int) -> dict[str, Slices]:
    """The trained parameters of more than `above` bytes whose AdamW states are
    cut into slices of about `slice_bytes` (`optim.Slices`), by name."""
    out: dict[str, Slices] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad or p.numel() * p.element_size() <= above:
            continue
        cut = slices_of(p.numel(), p.element_size(), slice_bytes)
        if cut is not None:
            out[name] = cut
    return out


def specs_of(
    model: nn.Module,
    *,
    accumulate: bool = False,
    working: torch.dtype | None = None,
    sliced: Mapping[str, Slices] | None = None,
) -> list[TensorSpec]:
    """Every parameter, and the AdamW states of those that train (plus, when
    gradients are accumulated over micro-batches, the running sum: a state
    like the others, cached and planned from the profile).

    With a `working` dtype (mixed precision) each floating parameter is held in
    that dtype, and each trained one gets an fp32 master copy (listed first: it
    is read from the model before the parameter is pointed at its buffer) and
    fp32 states; the gradient sum is kept in the working dtype, as `.grad` is.
    A parameter in `sliced` has each AdamW state as its slices, flat tensors
    `state_id(name, kind)@k` of one length (`Slices`)."""
    kinds = (*STATE_KINDS, GRAD_KIND) if accumulate else STATE_KINDS
    specs = []
    for name, p in model.named_parameters():
        mixed = working is not None and p.is_floating_point()
        compute = working if mixed and working is not None else p.dtype
        if mixed and p.requires_grad:
            master = state_id(name, MASTER_KIND)
            specs.append(TensorSpec(master, tuple(p.shape), torch.float32, MASTER_KIND))
        specs.append(TensorSpec(name, tuple(p.shape), compute, "param"))
        if p.requires_grad:
            state_dtype = torch.float32 if mixed else p.dtype
            cut = (sliced or {}).get(name)
            for k in kinds:
                dtype = compute if k == GRAD_KIND else state_dtype
                if cut is None or k == GRAD_KIND:
                    specs.append(TensorSpec(state_id(name, k), tuple(p.shape), dtype, k))
                else:
                    specs += [
                        TensorSpec(slice_id(state_id(name, k), i), (cut.length,), dtype, k)
                        for i in range(cut.count)
                    ]
    return specs


class _Wants(Protocol):
    @property
    def strategy(self) -> str: ...

    @property
    def fixed_window(self) -> int: ...


def initial_setup(
    config: _Wants, specs: Sequence[TensorSpec], budgets: Budgets, *, store_ok: bool
) -> Setup:
    """What a process starts on: `none` and `fixed` as asked; otherwise (and for
    `fixed` without a usable disk) the safe default."""
    if config.strategy == "none":
        return none_setup(specs)
    if config.strategy == "fixed" and store_ok:
        order = [s.tensor_id for s in specs if s.kind == "param"]
        return fixed_setup(specs, order, budgets, config.fixed_window)
    return safe_setup(specs, budgets, store_ok=store_ok)


def safe_setup(specs: Sequence[TensorSpec], budgets: Budgets, *, store_ok: bool) -> Setup:
    """`lru` within the budgets; without a usable NVMe tier, host memory takes what
    the disk would have held (over its budget; the engine logs it)."""
    if not store_ok:
        budgets = Budgets(budgets.fast, max(budgets.host, sum(s.size_class for s in specs)))
    return lru_setup(specs, budgets)
