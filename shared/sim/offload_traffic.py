"""Bytes one training step moves under an offload strategy, from its profile alone.

A replay of one step's access order (`TensorProfile.order`, repeats and all)
through the fast tier's buffers, with the rules of the offload engine
(offload_agent/strategies.py, shared/offload/policies.py) and none of its timing:

* `tencache`: the planner's plan (shared/offload/planner.py, the one the
  profiler service runs): residents never move; streamed tensors use their
  buffer class's streaming buffers, evicting the one whose next use is furthest
  away (Belady, exact: the order repeats). Every fetch is a prefetch.
* `lru`: per size class buffers in proportion to the class's bytes (the
  engine's `lru_setup`, `lru_layout`; the engine's borrowing of a larger
  buffer when a class is out of them is not replayed); fetch on demand,
  evict the least recently used.
* `fixed`: `fast // largest` equal buffers; parameters are prefetched (layer
  order), optimizer states come on demand; evict the least recently used.
* `none`: nothing moves.

A tensor is written back to its home when evicted after it changed; parameters
and optimizer states change at their last access of the step (the optimizer
step runs in backward). The replay runs the step twice and counts the second
(steady state: what the benchmark measures after its warm-up steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.messages import TensorProfile
from shared.offload.planner import (
    Budgets,
    buffer_classes,
    build_plan,
    lru_layout,
    size_class,
    step_group,
)
from shared.offload.policies import LayerOrderPolicy, OnDemandPolicy, PlanPolicy, Policy

__all__ = ["STRATEGIES", "Traffic", "step_traffic"]

STRATEGIES = ("none", "lru", "fixed", "tencache")
FIXED_WINDOW = 4  # parameters prefetched ahead by `fixed` (EngineConfig.fixed_window)


@dataclass(frozen=True, slots=True)
class Traffic:
    """One steady-state step of one process: bytes into and out of the fast tier."""

    ahead_bytes: int = 0  # prefetch reads and the write-backs they cause (may hide)
    demand_bytes: int = 0  # reads at the moment of use and their write-backs (never hidden)
    nvme_bytes: int = 0  # the part of both that reads or writes NVMe
    accesses: int = 0  # accesses to tensors in one step
    prefetches: int = 0  # copies started ahead of use
    demand_misses: int = 0  # accesses that found their tensor away and waited for it

    @property
    def bytes_moved(self) -> int:
        return self.ahead_bytes + self.demand_bytes


@dataclass(frozen=True, slots=True)
class _Layout:
    buffers: dict[int, int]  # streaming buffers per buffer class
    cls: dict[str, int]  # buffer class of every streamed tensor (residents: none)
    homes: dict[str, str]  # "gpu" (resident), "host" or "nvme"
    policy: Policy  # the engine's own prefetch / eviction rules (shared/offload/policies.py)


def step_traffic(
    profile: TensorProfile,
    strategy: str,
    budgets: Budgets,
    *,
    window: int = 8,
    stream_share: float = 0.9,
) -> Traffic:
    """Bytes the strategy moves in one steady-state step of `profile`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown offload strategy {strategy!r}; choose {STRATEGIES}")
    if strategy == "none":
        return Traffic(accesses=len(profile.order))
    sizes = {t: n for t, n, _d, _k in profile.tensors}
    kinds = {t: k for t, _n, _d, k in profile.tensors}
    if strategy == "tencache":
        layout = _plan_layout(profile, budgets, sizes, window, stream_share)
    elif strategy == "lru":
        layout = _lru_layout(profile, budgets, sizes, kinds)
    else:
        layout = _fixed_layout(profile, budgets, sizes, kinds)
    return _replay(profile.order, sizes, layout)


def _plan_layout(
    profile: TensorProfile, budgets: Budgets, sizes: dict[str, int], window: int, share: float
) -> _Layout:
    plan = build_plan(profile, budgets, window=window, stream_share=share)
    bufcls = buffer_classes(plan, sizes)
    streamed = {t for t, tier in plan.placement.items() if tier != "gpu"}
    resident_per_cls: dict[int, int] = {}
    for t, tier in plan.placement.items():
        if tier == "gpu":
            c = size_class(sizes[t])
            resident_per_cls[c] = resident_per_cls.get(c, 0) + 1
    buffers = {
        c: per["gpu"] - resident_per_cls.get(c, 0)
        for c, per in plan.buffers.items()
        if per.get("gpu", 0) > resident_per_cls.get(c, 0)
    }
    cls = {t: bufcls[t] for t in streamed}
    return _Layout(buffers, cls, dict(plan.placement), PlanPolicy(plan.prefetch, plan.window))


def _homes(order: Sequence[str], sizes: dict[str, int], host: int) -> dict[str, str]:
    """Host while the budget lasts, in first-use order, then NVMe (the engine's rule)."""
    homes: dict[str, str] = {}
    left = host
    for t in dict.fromkeys([*order, *sizes]):
        c = size_class(sizes[t])
        if c <= left:
            homes[t], left = "host", left - c
        else:
            homes[t] = "nvme"
    return homes


def _lru_layout(
    profile: TensorProfile, budgets: Budgets, sizes: dict[str, int], kinds: dict[str, str]
) -> _Layout:
    own = {t: size_class(n) for t, n in sizes.items()}
    group = step_group(kinds.values())
    layout, serve = lru_layout(list(own.values()), budgets.fast, group, strict=False)
    cls = {t: serve[c] for t, c in own.items()}
    homes = _homes(profile.order, sizes, budgets.host)
    return _Layout(layout, cls, homes, OnDemandPolicy())


def _fixed_layout(
    profile: TensorProfile, budgets: Budgets, sizes: dict[str, int], kinds: dict[str, str]
) -> _Layout:
    big = max(size_class(n) for n in sizes.values())
    states = [t for t in profile.order if kinds[t] != "param"]
    homes = _homes(states, {t: sizes[t] for t in sizes if kinds[t] != "param"}, budgets.host)
    homes.update({t: "nvme" for t in sizes if kinds[t] == "param"})
    count = budgets.fast // big
    window = min(FIXED_WINDOW, count - step_group(kinds.values()) - 1)
    params = [t for t in sizes if kinds[t] == "param"]  # module (layer) order
    policy = LayerOrderPolicy(params, max(window, 0))
    return _Layout({big: count}, dict.fromkeys(sizes, big), homes, policy)


class _Replay:
    """The fast tier's buffers during the replay: who holds one, who changed."""

    def __init__(self, order: Sequence[str], sizes: dict[str, int], lay: _Layout) -> None:
        self.sizes, self.lay = sizes, lay
        self.holders: dict[int, set[str]] = {c: set() for c in lay.buffers}
        self.last_use: dict[str, int] = {}
        self.dirty: set[str] = set()
        self.counting = False
        self.counts = [0, 0, 0, 0, 0]  # ahead, demand, nvme, prefetches, demand misses
        self.ahead: set[str] = set()  # fetched ahead, not used yet

    def loaded(self, t: str) -> bool:
        c = self.lay.cls.get(t)
        return c is None or t in self.holders[c]

    def fetch(self, t: str, clock: int, *, demand: bool, distance: float, busy: str) -> bool:
        """Bring `t` in (evicting per the policy); False when a prefetch gives up."""
        lay, c = self.lay, self.lay.cls[t]
        held = self.holders[c]
        moved, nvme = self.sizes[t], self.sizes[t] if lay.homes[t] == "nvme" else 0
        if len(held) >= lay.buffers[c]:
            rank = lay.policy.eviction_rank
            cands = [v for v in held if v != busy]
            if not cands:
                return False
            victim = max(cands, key=lambda v: (rank(v, self.last_use.get(v, 0)), v))
            if (
                not demand
                and lay.policy.protect_sooner
                and rank(victim, self.last_use.get(victim, 0)) <= distance
            ):
                return False
            held.discard(victim)
            self.ahead.discard(victim)
            if victim in self.dirty:  # written back before its buffer is refilled
                self.dirty.discard(victim)
                moved += self.sizes[victim]
                nvme += self.sizes[victim] if lay.homes[victim] == "nvme" else 0
        held.add(t)
        if self.counting:
            kind = 1 if demand else 0
            self.counts[kind] += moved
            self.counts[2] += nvme
            self.counts[3 + kind] += 1
        return True

    def prefetch(self, clock: int, busy: str) -> None:
        """The engine's rule: at most `policy.window` tensors fetched ahead and not
        yet used; tensors already loaded are passed over."""
        counted: set[str] = set()
        for u, distance in self.lay.policy.upcoming():
            if len(counted) >= self.lay.policy.window:
                return
            if u not in self.lay.cls or (self.loaded(u) and u not in self.ahead):
                continue
            if u not in self.ahead:
                if not self.fetch(u, clock, demand=False, distance=distance, busy=busy):
                    return
                self.last_use[u] = clock  # just fetched: not the next LRU victim
                self.ahead.add(u)
            counted.add(u)


def _replay(order: Sequence[str], sizes: dict[str, int], lay: _Layout) -> Traffic:
    last = {t: i for i, t in enumerate(order)}  # the optimizer step changes it here
    r = _Replay(order, sizes, lay)
    policy = lay.policy
    clock = 0
    for step in range(2):
        r.counting = step == 1
        policy.begin_step()
        r.prefetch(clock, "")
        for i, t in enumerate(order):
            clock += 1
            r.last_use[t] = clock
            r.ahead.discard(t)
            if not r.loaded(t):
                r.fetch(t, clock, demand=True, distance=0.0, busy="")
            policy.on_use(t, clock)
            if i == last[t] and t in lay.cls:
                r.dirty.add(t)
            r.prefetch(clock, t)
    c = r.counts
    return Traffic(c[0], c[1], c[2], len(order), c[3], c[4])


def _next_uses(order: Sequence[str]) -> list[int]:
    """For each access, the position of the same tensor's next access (cyclic)."""
    n = len(order)
    out = [0] * n
    seen: dict[str, int] = {}
    for i in range(2 * n - 1, -1, -1):
        t = order[i % n]
        if i < n:
            out[i] = seen.get(t, i + n) % n
        seen[t] = i
    return out
