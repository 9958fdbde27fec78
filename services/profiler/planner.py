"""10Cache's plan builder: from one warm-up step's tensor profile to a `PrefetchPlan`.

Pure and synchronous (no bus, no torch). Inputs: the tensors (id, bytes,
dtype, kind), their access order in one step (repeats allowed), and the
budgets of the fast tier (GPU) and the pinned host tier. Steps:

1. Size classes: each tensor's bytes rounded up to ALIGN (the O_DIRECT block),
   so every buffer of a class holds any tensor of it and can be read into
   straight from a swap file.
2. Streaming buffers per class: enough for the accesses of that class inside
   any `window` consecutive accesses (what prefetch keeps in flight) plus
   `MIN_INUSE` in use at once (a parameter and its two optimizer states, plus
   one held by backward). The window shrinks until these fit the fast budget.
3. Residents: the rest of the fast budget keeps tensors there for good,
   chosen by accesses per byte (ties: first used first) — every access to
   them is a hit and moves nothing. Small tensors go first at equal density.
4. Homes for the others: pinned host slabs by the same ranking while the
   host budget lasts, NVMe for the rest.
5. Prefetch order: the access order without the residents; eviction at run
   time follows it (furthest next use first).

Every buffer count in the plan is within budget by construction; `check_plan`
(used by tests and the engine) recomputes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from shared.errors import UserError
from shared.messages import PrefetchPlan, TensorProfile

__all__ = [
    "ALIGN",
    "MIN_INUSE",
    "Budgets",
    "PlanError",
    "build_plan",
    "check_plan",
    "size_class",
]

ALIGN = 4096  # equal to offload_agent.device.ALIGN (a test keeps them equal)
MIN_INUSE = 4
TIERS = ("gpu", "host", "nvme")


class PlanError(UserError):
    """The profile cannot be planned, or a plan breaks its profile or budgets."""


@dataclass(frozen=True, slots=True)
class Budgets:
    fast: int  # bytes of fast-tier (GPU) buffers
    host: int  # bytes of pinned host slabs


def size_class(nbytes: int) -> int:
    return max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)


def _validate_profile(profile: TensorProfile) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for tid, nbytes, _dtype, _kind in profile.tensors:
        if tid in sizes:
            raise PlanError(f"profile of {profile.job_id} lists tensor {tid!r} twice")
        if nbytes <= 0:
            raise PlanError(f"profile of {profile.job_id}: tensor {tid!r} has {nbytes} bytes")
        sizes[tid] = nbytes
    unknown = {t for t in profile.order if t not in sizes}
    if unknown:
        raise PlanError(
            f"profile of {profile.job_id}: order names unknown tensors {sorted(unknown)[:3]}"
        )
    return sizes


def _window_need(order: Sequence[str], cls: dict[str, int], window: int) -> Counter[int]:
    """Per class, the most accesses of that class in any `window` consecutive ones."""
    need: Counter[int] = Counter()
    live: Counter[int] = Counter()
    for i, tid in enumerate(order):
        live[cls[tid]] += 1
        if i >= window:
            live[cls[order[i - window]]] -= 1
        for c, n in live.items():
            if n > need[c]:
                need[c] = n
    return need


def _stream_layout(
    order: Sequence[str], cls: dict[str, int], streamed: set[str], window: int
) -> dict[int, int]:
    seq = [t for t in order if t in streamed]
    need = _window_need(seq, cls, window) if window > 0 else Counter()
    return {c: MIN_INUSE + need[c] for c in {cls[t] for t in streamed}}


def _bytes(layout: dict[int, int]) -> int:
    return sum(c * n for c, n in layout.items())


def build_plan(
    profile: TensorProfile, budgets: Budgets, *, window: int = 8, version: int = 1
) -> PrefetchPlan:
    """The plan for one job; raises `PlanError` when no plan fits the budgets."""
    sizes = _validate_profile(profile)
    cls = {t: size_class(n) for t, n in sizes.items()}
    uses = Counter(profile.order)
    first = {}
    for i, t in enumerate(profile.order):
        first.setdefault(t, i)
    ranked = sorted(sizes, key=lambda t: (-uses[t] / cls[t], first.get(t, 1 << 60), cls[t]))

    streamed = set(sizes)
    window = max(0, window)
    stream = _stream_layout(profile.order, cls, streamed, window)
    while _bytes(stream) > budgets.fast and window > 0:
        window //= 2
        stream = _stream_layout(profile.order, cls, streamed, window)
    if _bytes(stream) > budgets.fast:
        raise PlanError(
            f"fast budget {budgets.fast} B cannot hold the {_bytes(stream)} B of buffers "
            f"that streaming job {profile.job_id}'s tensors needs; raise the budget"
        )

    resident = _choose_residents(ranked, cls, streamed, stream, budgets.fast, profile.order, window)
    placement, host_counts = _homes(ranked, cls, resident, budgets.host)
    stream = _stream_layout(profile.order, cls, streamed - resident, window)
    buffers: dict[int, dict[str, int]] = {}
    for c, n in stream.items():
        buffers.setdefault(c, {})["gpu"] = n
    for t in resident:
        slot = buffers.setdefault(cls[t], {})
        slot["gpu"] = slot.get("gpu", 0) + 1
    for c, n in host_counts.items():
        buffers.setdefault(c, {})["host"] = n
    prefetch = [t for t in profile.order if t not in resident]
    return PrefetchPlan(
        job_id=profile.job_id,
        version=version,
        buffers=buffers,
        placement=placement,
        prefetch=prefetch,
        window=window,
    )


def _choose_residents(
    ranked: list[str],
    cls: dict[str, int],
    streamed: set[str],
    stream: dict[int, int],
    budget: int,
    order: Sequence[str],
    window: int,
) -> set[str]:
    """Greedy by accesses per byte; a class whose last streamed tensor becomes
    resident gives its streaming buffers back to the budget."""
    resident: set[str] = set()
    left = budget - _bytes(stream)
    per_class = Counter(cls[t] for t in streamed)
    for t in ranked:
        c = cls[t]
        refund = stream.get(c, 0) * c if per_class[c] == 1 else 0
        if c <= left + refund:
            resident.add(t)
            per_class[c] -= 1
            left -= c
            if refund:
                left += refund
                stream.pop(c, None)
    return resident


def _homes(
    ranked: list[str], cls: dict[str, int], resident: set[str], host_budget: int
) -> tuple[dict[str, str], Counter[int]]:
    placement: dict[str, str] = {}
    counts: Counter[int] = Counter()
    left = host_budget
    for t in ranked:
        if t in resident:
            placement[t] = "gpu"
        elif cls[t] <= left:
            placement[t] = "host"
            counts[cls[t]] += 1
            left -= cls[t]
        else:
            placement[t] = "nvme"
    return placement, counts


def check_plan(plan: PrefetchPlan, profile: TensorProfile, budgets: Budgets) -> None:
    """Raise `PlanError` unless `plan` fits `profile` and `budgets` (all of it)."""
    if plan.job_id != profile.job_id:
        raise PlanError(f"plan is for job {plan.job_id!r}, this process runs {profile.job_id!r}")
    sizes = {t: n for t, n, _d, _k in profile.tensors}
    if set(plan.placement) != set(sizes):
        missing = sorted(set(sizes) ^ set(plan.placement))[:3]
        raise PlanError(
            f"plan for {plan.job_id} does not place exactly the profiled tensors: {missing}"
        )
    bad = {tier for tier in plan.placement.values() if tier not in TIERS}
    if bad:
        raise PlanError(f"plan for {plan.job_id} names unknown tiers {sorted(bad)}")
    if plan.window < 0 or any(t not in sizes for t in plan.prefetch):
        raise PlanError(f"plan for {plan.job_id} has a bad prefetch list or window")
    total = {tier: 0 for tier in TIERS}
    for c, per_tier in plan.buffers.items():
        for tier, n in per_tier.items():
            if tier not in TIERS or n < 0 or c % ALIGN:
                raise PlanError(f"plan for {plan.job_id}: bad buffer entry {c}: {per_tier}")
            total[tier] += c * n
    for tier, budget in (("gpu", budgets.fast), ("host", budgets.host)):
        if total[tier] > budget:
            raise PlanError(
                f"plan for {plan.job_id} needs {total[tier]} B of {tier} buffers, budget {budget} B"
            )
    _check_counts(plan, sizes)


def _check_counts(plan: PrefetchPlan, sizes: dict[str, int]) -> None:
    """Every resident and host-homed tensor has its own buffer; streamed classes
    keep at least MIN_INUSE free for use."""
    want: dict[tuple[int, str], int] = Counter()
    for t, tier in plan.placement.items():
        if tier != "nvme":
            want[size_class(sizes[t]), tier] += 1
    streamed = {size_class(sizes[t]) for t, tier in plan.placement.items() if tier != "gpu"}
    for (c, tier), n in want.items():
        extra = MIN_INUSE if tier == "gpu" and c in streamed else 0
        have = plan.buffers.get(c, {}).get(tier, 0)
        if have < n + extra:
            raise PlanError(
                f"plan for {plan.job_id}: {n + extra} {tier} buffers of {c} B needed, {have} given"
            )
    for c in streamed:
        if plan.buffers.get(c, {}).get("gpu", 0) < MIN_INUSE + want.get((c, "gpu"), 0):
            raise PlanError(f"plan for {plan.job_id}: too few fast buffers of {c} B to stream")
