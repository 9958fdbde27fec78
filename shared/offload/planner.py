"""10Cache's plan builder: from one warm-up step's tensor profile to a `PrefetchPlan`.

Pure and synchronous (no bus, no torch). Inputs: the tensors (id, bytes,
dtype, kind), their access order in one step (repeats allowed), and the
budgets of the fast tier (GPU) and the pinned host tier. Steps:

1. Size classes: each tensor's bytes rounded up to ALIGN (the O_DIRECT block),
   so every buffer of a class holds any tensor of it and can be read into
   straight from a swap file.
2. Streaming buffers per class: enough for the accesses of that class inside
   any `window` consecutive streamed accesses (what prefetch keeps in flight)
   plus the buffers in use at once (a parameter and its optimizer states, the
   two of AdamW and the gradient sum when gradients are accumulated, plus one
   held by backward in small classes). A streamed class may borrow
   the buffers of a class at most `MERGE` times bigger, so a few idle buffers
   serve several sizes. When the floors do not fit, or leave a lead shorter
   than one parameter's optimizer step plus the next fetch (`group` + 1
   accesses), classes up to 2x, 4x apart, then one class for all (`MERGES`)
   are tried in turn, and the first with that lead (else the longest) is
   taken; the factor travels in the plan. The window
   shrinks until these take at most `stream_share` of the fast budget:
   measured on the benchmark, a prefetch lead of a few tensors is worth more
   than keeping a few more resident.
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shared.errors import UserError
from shared.messages import PrefetchPlan, TensorProfile

__all__ = [
    "ALIGN",
    "MIN_INUSE",
    "Budgets",
    "PlanError",
    "buffer_classes",
    "build_plan",
    "check_plan",
    "in_use_floor",
    "lone_params",
    "lru_layout",
    "size_class",
    "step_group",
]

ALIGN = 4096  # equal to offload_agent.device.ALIGN (a test keeps them equal)
MIN_INUSE = 4
LONE_FLOOR = 2  # buffers of a class of parameters stepped without whole states
SMALL = 1 << 16  # classes up to this size get one more in-use buffer
MERGE = 1.34  # a streamed class may use buffers of a class up to this much bigger
# when the in-use floors of the streamed classes do not fit the fast budget (a
# model with many tensor sizes, ResNet), fewer, larger classes: the last is one
# class for everything streamed, ZeRO-Infinity's buffers
MERGES = (MERGE, 2.0, 4.0, 1e12)
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
    """Per class, the most distinct tensors of that class in any `window` consecutive
    accesses (a tensor used twice in a row is fetched once)."""
    need: Counter[int] = Counter()
    live: Counter[int] = Counter()
    seen: Counter[str] = Counter()
    for i, tid in enumerate(order):
        seen[tid] += 1
        if seen[tid] == 1:
            live[cls[tid]] += 1
        if i >= window:
            old = order[i - window]
            seen[old] -= 1
            if seen[old] == 0:
                live[cls[old]] -= 1
        c = cls[tid]
        need[c] = max(need[c], live[c])
    return need


def step_group(kinds: Iterable[str]) -> int:
    """Tensors one parameter's optimizer step holds at once: the parameter and
    each kind of state there is (AdamW's two; a third, the gradient sum, when
    gradients are accumulated over micro-batches). Never fewer than three."""
    return max(MIN_INUSE - 1, 1 + len(set(kinds) - {"param"}))


def in_use_floor(size: int, group: int = MIN_INUSE - 1) -> int:
    """Buffers of a class that may be in use at once: a parameter's optimizer
    step (`group` tensors), plus (small classes, where LayerNorm weight and bias
    share one) a weight held by backward."""
    return group + 1 if size <= SMALL else group


def lone_params(tensors: Iterable[tuple[str, int, str, str]]) -> frozenset[str]:
    """Parameters whose optimizer step holds no whole state of theirs: their
    states are cut into slices (`name#kind@k`, `offload_agent.optim.Slices`)
    and stream through a class of their own. A buffer class of such
    parameters only needs LONE_FLOOR."""
    listed = list(tensors)
    sliced: set[str] = set()
    whole: set[str] = set()
    # a state's id is `param#kind`, a slice's `param#kind@k`: a kind holds neither
    # '#' nor '@' (a parameter's name may), so the last '#' splits off the owner
    for t, _n, _d, k in listed:
        if k != "param":
            owner, _, tail = t.rpartition("#")
            (sliced if "@" in tail else whole).add(owner)
    return frozenset(
        t for t, _n, _d, k in listed if k == "param" and t in sliced and t not in whole
    )


@dataclass(frozen=True, slots=True)
class _Floors:
    """The in-use floor of each streamed buffer class: `in_use_floor(c, group)`,
    or LONE_FLOOR for a class whose tensors are all lone parameters (one in its
    optimizer step or backward, one more held by backward)."""

    group: int
    lone: frozenset[str] = frozenset()

    def layout(self, bufcls: dict[str, int]) -> dict[int, int]:
        shared = {c for t, c in bufcls.items() if t not in self.lone}
        return {
            c: in_use_floor(c, self.group) if c in shared else LONE_FLOOR
            for c in set(bufcls.values())
        }


def lru_layout(
    classes: Sequence[int], fast: int, group: int, *, strict: bool = True
) -> tuple[dict[int, int], dict[int, int]]:
    """The `lru` strategy's fast buffers for tensors of these size classes (one
    entry per tensor), and the class each size class's tensors take buffers
    from. The only floor: the buffers one parameter's optimizer step and
    backward hold at once (`in_use_floor` of the largest class), given from the
    largest class down (one more of a smaller class where the larger has no
    more tensors); the rest of the budget goes to every class in proportion to
    its bytes. A class left with no buffer uses the next larger class that has
    one (the engine, out of buffers of a class, also borrows larger ones).
    No floor per class: a model with many tensor sizes (ResNet) would need a
    multiple of its largest tensors for floors alone. `strict=False` (replays
    of a budget too small to start) keeps the floor over the budget."""
    by_class = Counter(classes)
    if not by_class:
        return {}, {}
    sizes = sorted(by_class, reverse=True)
    need = in_use_floor(sizes[0], group)
    layout = dict.fromkeys(sizes, 0)
    for c in sizes:
        take = min(need, by_class[c])
        layout[c], need = take, need - take
        if need == 0:
            break
    spare = fast - _bytes(layout)
    if spare < 0 and not strict:
        spare = 0
    if spare < 0:
        raise ValueError(f"fast budget {fast} B is below the {fast - spare} B minimum")
    total = sum(c * n for c, n in by_class.items())
    for c in sizes:  # largest first: rounding leaves the small classes their share
        extra = min(by_class[c] - layout[c], int(spare * (c * by_class[c] / total)) // c)
        layout[c] += extra
    left = fast - _bytes(layout)
    for c in sizes:  # what rounding left: one more buffer where it still fits
        while left >= c and layout[c] < by_class[c]:
            layout[c] += 1
            left -= c
    serve: dict[int, int] = {}
    bigger_with_buffers = sizes[0]
    for c in sizes:
        if layout[c]:
            bigger_with_buffers = c
        serve[c] = bigger_with_buffers
    return {c: n for c, n in layout.items() if n}, serve


def stream_classes(
    sizes: dict[str, int], streamed: set[str], merge: float = MERGE
) -> dict[str, int]:
    """The buffer class each streamed tensor uses: its own size class, or a larger
    streamed class at most `merge` times bigger (fewer classes, fewer idle buffers)."""
    own = sorted({size_class(sizes[t]) for t in streamed}, reverse=True)
    target: dict[int, int] = {}
    for c in own:
        bigger = [target[b] for b in own if b > c and target[b] <= c * merge]
        target[c] = min(bigger) if bigger else c
    return {t: target[size_class(sizes[t])] for t in streamed}


def _stream_layout(
    order: Sequence[str], bufcls: dict[str, int], window: int, group: _Floors
) -> dict[int, int]:
    seq = [t for t in order if t in bufcls]
    need = _window_need(seq, bufcls, window) if window > 0 else Counter()
    return {c: floor + need[c] for c, floor in group.layout(bufcls).items()}


def _bytes(layout: dict[int, int]) -> int:
    return sum(c * n for c, n in layout.items())


def build_plan(
    profile: TensorProfile,
    budgets: Budgets,
    *,
    window: int = 8,
    stream_share: float = 0.9,
    version: int = 1,
) -> PrefetchPlan:
    """The plan for one job; raises `PlanError` when no plan fits the budgets.

    `window` is the most streamed accesses prefetched ahead; it shrinks until the
    streaming buffers take at most `stream_share` of the fast budget (or, failing
    that, until they fit at all)."""
    sizes = _validate_profile(profile)
    group = _Floors(
        step_group(kind for _t, _n, _d, kind in profile.tensors), lone_params(profile.tensors)
    )
    cls = {t: size_class(n) for t, n in sizes.items()}
    uses = Counter(profile.order)
    first: dict[str, int] = {}
    for i, t in enumerate(profile.order):
        first.setdefault(t, i)
    ranked = sorted(sizes, key=lambda t: (-uses[t] / cls[t], first.get(t, 1 << 60), cls[t]))
    # Fewer, larger classes free the in-use floors of the merged ones: taken
    # only when the plan would otherwise not fit, or its lead would not cover
    # one parameter's optimizer step (its `group` accesses) and the next fetch.
    enough = min(window, group.group + 1)
    error: PlanError | None = None
    fits: list[tuple[set[str], int, float]] = []
    for m in MERGES:
        try:
            r, w = _choose(
                profile.order, ranked, cls, sizes, budgets.fast, window, stream_share, group, m
            )
        except PlanError as exc:
            error = error or exc
            continue
        fits.append((r, w, m))
        if w >= enough:
            break
    if not fits:
        assert error is not None
        raise error
    resident, window, merge = max(fits, key=lambda f: f[1])  # ties: the fewer merges
    streamed = set(sizes) - resident
    bufcls = stream_classes(sizes, streamed, merge)
    stream = _stream_layout(profile.order, bufcls, window, group)
    placement, host_counts = _homes(ranked, cls, resident, budgets.host)
    buffers: dict[int, dict[str, int]] = {}
    for c, n in stream.items():
        buffers.setdefault(c, {})["gpu"] = n
    for t in resident:
        slot = buffers.setdefault(cls[t], {})
        slot["gpu"] = slot.get("gpu", 0) + 1
    for c, n in host_counts.items():
        buffers.setdefault(c, {})["host"] = n
    return PrefetchPlan(
        job_id=profile.job_id,
        version=version,
        buffers=buffers,
        placement=placement,
        prefetch=[t for t in profile.order if t not in resident],
        window=window,
        merge=merge,
    )


def _choose(
    order: Sequence[str],
    ranked: list[str],
    cls: dict[str, int],
    sizes: dict[str, int],
    budget: int,
    window: int,
    share: float,
    group: _Floors,
    merge: float,
) -> tuple[set[str], int]:
    """The largest window whose streaming buffers, next to the residents chosen for
    it, take at most `share` of the budget; else the smallest window of at
    least one that fits (one buffer of lead hides a copy behind the compute of
    the tensor before it, which keeping more residents cannot buy back when a
    few large tensors, an embedding and a head, eat the budget); no prefetch
    only when not even that fits."""
    lead: tuple[set[str], int] | None = None
    for w in range(max(0, window), -1, -1):
        resident, stream_bytes, total = _choose_residents(
            ranked, cls, sizes, order, budget, w, group, merge
        )
        if total > budget:
            continue
        if stream_bytes <= budget * share and (w > 0 or lead is None):
            return resident, w
        if w > 0:
            lead = (resident, w)  # the smallest fitting window >= 1 so far
        elif lead is not None:
            return lead
        else:
            return resident, w
    if lead is not None:
        return lead
    floor = _bytes(_stream_layout(order, stream_classes(sizes, set(sizes), merge), 0, group))
    raise PlanError(
        f"fast budget {budget} B cannot hold the {floor} B of buffers that streaming "
        "this job's tensors needs; raise the budget"
    )


def _choose_residents(
    ranked: list[str],
    cls: dict[str, int],
    sizes: dict[str, int],
    order: Sequence[str],
    budget: int,
    window: int,
    group: _Floors,
    merge: float = MERGE,
) -> tuple[set[str], int, int]:
    """Greedy by accesses per byte: keep a tensor for good while the residents plus
    the streaming buffers the others still need fit the fast budget. Returns the
    residents, the streaming bytes and the total.

    Linear in the tensors: the greedy pass prices a candidate with the streaming
    layout as it stands (a class's buffers come back when its last streamed
    tensor becomes resident); the exact layout is then recomputed, and the
    last-chosen residents are given back while it does not fit."""
    resident: set[str] = set()
    cheap = _cheap(order, sizes, window, group, merge)
    streamed = set(sizes) - cheap
    if sum(cls[t] for t in cheap) + _exact(order, sizes, streamed, window, group, merge) <= budget:
        resident = set(cheap)
    bufcls = stream_classes(sizes, set(sizes) - resident, merge)
    layout = _stream_layout(order, bufcls, window, group)
    members = Counter(bufcls.values())
    used = sum(cls[t] for t in resident) + _bytes(layout)
    chosen: list[str] = []
    for t in ranked:
        if t in resident:
            continue
        c = bufcls[t]
        refund = layout.get(c, 0) * c if members[c] == 1 else 0
        if used + cls[t] - refund <= budget:
            resident.add(t)
            chosen.append(t)
            members[c] -= 1
            used += cls[t] - refund
            if refund:
                layout.pop(c)
    while True:
        stream = _exact(order, sizes, set(sizes) - resident, window, group, merge)
        total = sum(cls[t] for t in resident) + stream
        if total <= budget or not chosen:
            return resident, stream, total
        resident.discard(chosen.pop())


def _exact(
    order: Sequence[str],
    sizes: dict[str, int],
    streamed: set[str],
    window: int,
    group: _Floors,
    merge: float = MERGE,
) -> int:
    if not streamed:
        return 0
    return _bytes(_stream_layout(order, stream_classes(sizes, streamed, merge), window, group))


def _cheap(
    order: Sequence[str], sizes: dict[str, int], window: int, group: _Floors, merge: float = MERGE
) -> set[str]:
    """Tensors of classes with no more members than streaming them would need
    buffers: keeping all of them costs no more bytes, and every access hits."""
    bufcls = stream_classes(sizes, set(sizes), merge)
    layout = _stream_layout(order, bufcls, window, group)
    members = Counter(bufcls.values())
    return {t for t, c in bufcls.items() if members[c] <= layout[c]}


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
    _check_counts(
        plan,
        sizes,
        _Floors(
            step_group(kind for _t, _n, _d, kind in profile.tensors),
            lone_params(profile.tensors),
        ),
    )


def buffer_classes(plan: PrefetchPlan, sizes: dict[str, int]) -> dict[str, int]:
    """The fast buffer class of every tensor under `plan`: residents their own size
    class, streamed tensors the class `stream_classes` gives (engine and check agree)."""
    streamed = {t for t, tier in plan.placement.items() if tier != "gpu"}
    out = {t: size_class(sizes[t]) for t, tier in plan.placement.items() if tier == "gpu"}
    out.update(stream_classes(sizes, streamed, plan.merge))
    return out


def _check_counts(plan: PrefetchPlan, sizes: dict[str, int], group: _Floors) -> None:
    """Every resident and host-homed tensor has its own buffer, and every class that
    streams keeps its in-use floor on top of its residents."""
    want: Counter[tuple[int, str]] = Counter()
    for t, tier in plan.placement.items():
        if tier != "nvme":
            want[size_class(sizes[t]), tier] += 1
    streaming = {t: c for t, c in buffer_classes(plan, sizes).items() if plan.placement[t] != "gpu"}
    for c, floor in group.layout(streaming).items():
        want[c, "gpu"] += floor
    for (c, tier), n in want.items():
        have = plan.buffers.get(c, {}).get(tier, 0)
        if have < n:
            raise PlanError(
                f"plan for {plan.job_id}: {n} {tier} buffers of {c} B needed, {have} given"
            )
