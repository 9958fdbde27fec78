"""The plan builder: every plan fits every budget, or there is no plan."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from offload_agent.device import ALIGN as DEVICE_ALIGN
from shared.messages import PrefetchPlan, TensorProfile
from shared.offload.planner import (
    ALIGN,
    LONE_FLOOR,
    MERGE,
    Budgets,
    PlanError,
    buffer_classes,
    build_plan,
    check_plan,
    in_use_floor,
    lone_params,
    step_group,
)
from shared.offload.policies import PlanPolicy

KIB = 1024


def _profile(sizes: list[int], order_idx: list[int], job: str = "j") -> TensorProfile:
    tensors = [(f"t{i}", n, "float32", "param") for i, n in enumerate(sizes)]
    order = [f"t{i % len(sizes)}" for i in order_idx] or [t[0] for t in tensors]
    return TensorProfile(job_id=job, tensors=tensors, order=order)


def test_align_matches_the_device_layer() -> None:
    assert ALIGN == DEVICE_ALIGN


def test_hand_solved_plan() -> None:
    """Two hot small tensors and eight cold 128 KiB ones used once each. The fast
    budget holds the smalls plus the 128 KiB class's streaming floor (3 in use + 1
    for a window of one): no big one can stay; the first used goes to host."""
    bigs = [f"b{i}" for i in range(8)]
    profile = TensorProfile(
        job_id="j",
        tensors=[("a", 100, "float32", "param"), ("b", 100, "float32", "param")]
        + [(t, 128 * KIB, "float32", "param") for t in bigs],
        order=["a", *bigs[:4], "b", *bigs[4:], "a", "b"],
    )
    big = 128 * KIB
    fast, host = 2 * 4 * KIB + (in_use_floor(big) + 1) * big, big
    plan = build_plan(profile, Budgets(fast, host), window=1, stream_share=1.0)
    assert in_use_floor(big) == 3
    assert plan.placement == {"a": "gpu", "b": "gpu", "b0": "host"} | {t: "nvme" for t in bigs[1:]}
    assert plan.prefetch == bigs
    assert plan.window == 1
    assert plan.buffers == {4096: {"gpu": 2}, big: {"gpu": 4, "host": 1}}
    check_plan(plan, profile, Budgets(fast, host))


def test_many_sizes_merge_into_fewer_classes_rather_than_refuse() -> None:
    """ResNet's shape: eight sizes, each half the next, three tensors each (a
    parameter and its two states), one step's order. At 1.34x merging every
    size is its own class and the floors alone (3 buffers each) need
    3 x (sum of the sizes) ~ 6 x the largest; a budget of 4.5 x the largest
    must still plan, with a prefetch lead: into fewer classes, within the
    budget, and checked."""
    sizes = [(1 << 20) >> i for i in range(8)]
    tensors = [(f"s{i}k{k}", n, "float32", kind) for i, n in enumerate(sizes)
               for k, kind in enumerate(("param", "exp_avg", "exp_avg_sq"))]  # fmt: skip
    order = [t[0] for t in tensors]
    profile = TensorProfile(job_id="j", tensors=tensors, order=order)
    budgets = Budgets(int(4.5 * (1 << 20)), 0)
    floors_apart = 3 * sum(_class(n) for n in sizes)
    assert floors_apart > budgets.fast  # what a 1.34x merge would need for floors
    plan = build_plan(profile, budgets, window=1)
    assert plan.merge > MERGE and plan.window == 1
    check_plan(plan, profile, budgets)
    bufcls = buffer_classes(plan, dict((t, n) for t, n, _d, _k in tensors))
    for t, n, _d, _k in tensors:
        assert _class(n) <= bufcls[t] <= _class(n) * plan.merge


# The test's own reading of the planner docstring (not the planner's helpers):
# a size class is the bytes rounded up to ALIGN; a streamed buffer class keeps
# in use a parameter's optimizer step (the parameter and each kind of state,
# never fewer than three) plus, up to 64 KiB, one held by backward.
SMALL_CLASS = 64 * KIB
KINDS = ("param", "exp_avg", "exp_avg_sq", "grad")


def _class(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


def _group(kinds: set[str]) -> int:
    return max(3, 1 + len(kinds - {"param"}))


def _in_use(size: int, group: int) -> int:
    return group + 1 if size <= SMALL_CLASS else group


def _most_in_window(seq: list[tuple[str, int]], cls: int, window: int) -> int:
    """The most distinct tensors of buffer class `cls` in any `window` consecutive
    accesses (`seq`: tensor and buffer class per access; a tensor accessed twice
    in a window is fetched once)."""
    if window <= 0:
        return 0
    starts = range(max(1, len(seq) - window + 1))
    return max(len({t for t, c in seq[i : i + window] if c == cls}) for i in starts)


@st.composite
def planner_cases(draw: st.DrawFn) -> tuple[TensorProfile, Budgets, int, float, str]:
    """A profile whose tensors share a few size classes (so streaming can pay), and a
    fast budget that is mostly between the streaming floor and the all-resident total."""
    palette = draw(st.lists(st.integers(1, 300 * KIB), min_size=1, max_size=4))
    picks = draw(
        st.lists(
            st.tuples(st.sampled_from(palette), st.integers(0, ALIGN - 1)), min_size=4, max_size=40
        )
    )
    kinds = draw(st.sampled_from([KINDS[:1], KINDS[:3], KINDS]))
    tensors = [
        (f"t{i}", max(1, p - jitter), "float32", kinds[i % len(kinds)])
        for i, (p, jitter) in enumerate(picks)
    ]
    n = len(tensors)
    order = [f"t{i}" for i in draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=80))]
    profile = TensorProfile(job_id="j", tensors=tensors, order=order)
    group = _group({k for *_x, k in tensors})
    classes = [_class(nb) for _t, nb, _d, _k in tensors]
    total = sum(classes)  # everything resident
    # Streaming everything at window 0, each size class its own buffers (merging
    # classes only lowers this): at or above it a plan must exist.
    floor = sum(_in_use(c, group) * c for c in set(classes))
    region = draw(st.sampled_from(["stream"] * 14 + ["roomy"] * 3 + ["tight"] * 3))
    if region == "stream" and floor < total:
        kind, fast = "stream", draw(st.integers(floor, total - 1))
    elif region != "tight":
        top = max(floor, total)
        kind, fast = "roomy", draw(st.integers(top, 2 * top))
    else:
        kind, fast = "tight", draw(st.integers(0, floor - 1))
    host = draw(st.integers(0, total + ALIGN))
    window = draw(st.integers(0, 12))
    share = draw(st.floats(0.1, 1.0))
    return profile, Budgets(fast, host), window, share, kind


@settings(max_examples=200, deadline=None)
@given(case=planner_cases())
def test_plans_respect_every_budget(case: tuple[TensorProfile, Budgets, int, float, str]) -> None:
    profile, budgets, window, share, region = case
    sizes = {t: nb for t, nb, _d, _k in profile.tensors}
    cls = {t: _class(nb) for t, nb in sizes.items()}
    group = _group({k for *_x, k in profile.tensors})
    total = sum(cls.values())
    floor = sum(_in_use(c, group) * c for c in set(cls.values()))
    # Any plan either keeps everything (total) or streams a tensor (its in-use floor).
    least = min(total, min(_in_use(c, group) * c for c in cls.values()))
    try:
        plan = build_plan(profile, budgets, window=window, stream_share=share)
    except PlanError as exc:
        event("PlanError")
        assert budgets.fast < floor, f"no plan for a fast budget at or above the floor {floor}"
        assert "raise the budget" in str(exc)
        return
    assert budgets.fast >= least, f"a plan in {budgets.fast} B, below any plan's {least} B"
    check_plan(plan, profile, budgets)
    assert set(plan.placement) == set(sizes)
    assert 0 <= plan.window <= window

    resident = {t for t, tier in plan.placement.items() if tier == "gpu"}
    streamed = set(sizes) - resident
    # Every streamed tensor lives on host or NVMe; the prefetch list is the access
    # order without the residents, repeats and all.
    assert all(plan.placement[t] in ("host", "nvme") for t in streamed)
    assert plan.prefetch == [t for t in profile.order if t not in resident]
    uses = Counter(profile.order)
    assert Counter(plan.prefetch) == {t: uses[t] for t in streamed if uses[t]}
    if budgets.fast < total:  # not everything fits: the plan must stream
        assert streamed, f"{budgets.fast} B < {total} B yet everything is resident"
    if region == "stream":
        assert streamed

    gpu = sum(c * t.get("gpu", 0) for c, t in plan.buffers.items())
    hostb = sum(c * t.get("host", 0) for c, t in plan.buffers.items())
    assert gpu <= budgets.fast and hostb <= budgets.host
    # Homes: host slabs while the host budget lasts, then NVMe.
    on_host = [t for t in streamed if plan.placement[t] == "host"]
    host_left = budgets.host - sum(cls[t] for t in on_host)
    assert host_left >= 0
    assert all(cls[t] > host_left for t in streamed if plan.placement[t] == "nvme")
    for c, n in Counter(cls[t] for t in on_host).items():
        assert plan.buffers[c].get("host", 0) >= n

    # GPU buffers per class: one per resident of that class, and for a class that
    # streams, the in-use floor plus its accesses in any `window` streamed ones.
    bufcls = buffer_classes(plan, sizes)
    for t in streamed:
        assert cls[t] <= bufcls[t] <= cls[t] * plan.merge
    seq = [(t, bufcls[t]) for t in profile.order if t in streamed]
    for c in set(cls.values()) | set(bufcls.values()):
        want = sum(1 for t in resident if cls[t] == c)
        if any(bufcls[t] == c for t in streamed):
            want += _in_use(c, group) + _most_in_window(seq, c, plan.window)
        assert plan.buffers.get(c, {}).get("gpu", 0) >= want, (c, want, plan.buffers)

    repeats = any(uses[t] > 1 for t in streamed)
    event("streams, repeated prefetches" if repeats else "streams" if streamed else "all on GPU")
    target(float(len(plan.prefetch)), label="prefetch length")


def _plan() -> tuple[TensorProfile, Budgets]:
    profile = _profile([10 * KIB, 200 * KIB, 200 * KIB, 50 * KIB], [0, 1, 2, 3, 0, 1])
    return profile, Budgets(fast=2 << 20, host=256 * KIB)


def test_check_refuses_foreign_and_tampered_plans() -> None:
    profile, budgets = _plan()
    plan = build_plan(profile, budgets)
    check_plan(plan, profile, budgets)
    bad = [
        (msgspec.structs.replace(plan, job_id="other"), "other"),
        (msgspec.structs.replace(plan, buffers={**plan.buffers, 1 << 24: {"gpu": 1}}), "budget"),
        (msgspec.structs.replace(plan, placement={**plan.placement, "t9": "gpu"}), "exactly"),
        (msgspec.structs.replace(plan, placement={**plan.placement, "t0": "tape"}), "tier"),
        (msgspec.structs.replace(plan, prefetch=["ghost"]), "prefetch"),
        (msgspec.structs.replace(plan, buffers={}), "needed"),
    ]
    for tampered, words in bad:
        with pytest.raises(PlanError, match=words):
            check_plan(tampered, profile, budgets)


def test_bad_profiles_are_plan_errors() -> None:
    dup = TensorProfile("j", [("a", 1, "f", "param"), ("a", 2, "f", "param")], ["a"])
    with pytest.raises(PlanError, match="twice"):
        build_plan(dup, Budgets(1 << 20, 0))
    ghost = TensorProfile("j", [("a", 1, "f", "param")], ["a", "b"])
    with pytest.raises(PlanError, match="unknown"):
        build_plan(ghost, Budgets(1 << 20, 0))
    zero = TensorProfile("j", [("a", 0, "f", "param")], ["a"])
    with pytest.raises(PlanError, match="0 bytes"):
        build_plan(zero, Budgets(1 << 20, 0))


def test_tiny_fast_budget_is_a_clear_error() -> None:
    profile, _ = _plan()
    with pytest.raises(PlanError, match="raise the budget"):
        build_plan(profile, Budgets(fast=ALIGN, host=0))


def test_accumulated_gradients_raise_the_in_use_floor() -> None:
    """With gradient accumulation one parameter's optimizer step holds four
    tensors (parameter, two AdamW states, gradient sum): a streamed class keeps
    four buffers in use, and a plan made for three is refused."""
    big = 128 * KIB
    kinds = ("param", "exp_avg", "exp_avg_sq", "grad")
    tensors = [(f"w{i}#{k}", big, "float32", k) for i in range(6) for k in kinds]
    profile = TensorProfile(job_id="j", tensors=tensors, order=[t[0] for t in tensors])
    assert step_group(kinds) == 4 and step_group(kinds[:3]) == 3 and step_group(["param"]) == 3
    budgets = Budgets(4 * big, 1 << 30)  # room for exactly the floor, nothing resident
    plan = build_plan(profile, budgets, window=0)
    assert plan.buffers[big]["gpu"] == in_use_floor(big, 4) == 4
    assert set(plan.placement.values()) == {"host"}
    check_plan(plan, profile, budgets)
    short = msgspec.structs.replace(plan, buffers={big: {"gpu": 3, "host": 24}})
    with pytest.raises(PlanError, match="4 gpu buffers of 131072 B needed, 3 given"):
        check_plan(short, profile, budgets)
    with pytest.raises(PlanError, match="cannot hold"):
        build_plan(profile, Budgets(3 * big, 1 << 30), window=0)


def _lm_profile() -> TensorProfile:
    """An untied embedding and head of 1 MiB each and eight 64 KiB layers, with
    AdamW states, in a step's order: forward, backward, each parameter's
    optimizer step right after its last backward use."""
    params = [("emb", 1 << 20), *((f"l{i}", 64 * KIB) for i in range(8)), ("head", 1 << 20)]
    tensors = []
    for name, n in params:
        tensors += [(name, n, "float32", "param")]
        tensors += [(f"{name}#{k}", n, "float32", k) for k in ("exp_avg", "exp_avg_sq")]
    order = [name for name, _ in params]
    for name, _ in reversed(params):
        order += [name, name, f"{name}#exp_avg", f"{name}#exp_avg_sq"]
    return TensorProfile(job_id="lm", tensors=tensors, order=order)


def test_one_buffer_of_lead_beats_no_prefetch_when_large_tensors_eat_the_budget() -> None:
    """With a budget where the 1 MiB class's streaming buffers cannot stay under
    the streaming share at any window of one or more, but one buffer of lead
    fits, the plan prefetches one ahead instead of nothing."""
    profile = _lm_profile()
    budget = Budgets(fast=int(4.6 * (1 << 20)), host=0)
    plan = build_plan(profile, budget)
    check_plan(plan, profile, budget)
    assert plan.window >= 1
    assert {plan.placement["emb"], plan.placement["head"]} == {"nvme"}  # streamed, not resident
    policy = PlanPolicy(plan.prefetch, plan.window)
    policy.begin_step()
    assert policy.lead == plan.window
    assert [t for t, _ in list(policy.upcoming())][: plan.window] == plan.prefetch[: plan.window]


@settings(max_examples=150)
@given(
    st.lists(st.sampled_from([1, 2, 3, 16, 64, 300]), min_size=1, max_size=40),
    st.floats(0.0, 1.2),
)
def test_lru_layout_within_budget_and_enough_for_one_step(mults: list[int], frac: float) -> None:
    """`lru`'s buffers: within the budget, never more of a class than it has
    tensors, at least the in-use floor's worth of buffers as large as the
    largest tensor that can be in use, every class served by a class at least
    as large that has buffers, and a budget below the floor refused."""
    from shared.offload.planner import lru_layout

    classes = [ALIGN * m for m in mults]
    by_class = Counter(classes)
    largest = max(classes)
    floor_n = in_use_floor(largest, 3)
    need, floor_bytes = floor_n, 0
    for c in sorted(by_class, reverse=True):  # the test's own reading of the cascade
        take = min(need, by_class[c])
        floor_bytes, need = floor_bytes + take * c, need - take
    fast = floor_bytes + int(frac * (sum(classes) - floor_bytes))
    layout, serve = lru_layout(classes, fast, 3)
    assert sum(c * n for c, n in layout.items()) <= fast
    assert all(0 < n <= by_class[c] for c, n in layout.items())
    assert sum(layout.values()) >= min(floor_n, len(classes))
    for c in by_class:
        assert serve[c] >= c and serve[c] in layout
    if floor_bytes > ALIGN:
        with pytest.raises(ValueError, match="minimum"):
            lru_layout(classes, floor_bytes - ALIGN, 3)


def test_a_tensor_used_twice_in_a_window_takes_one_lead_buffer() -> None:
    """Order t0 t0 t1 over seven 4 KiB tensors (three 8 KiB ones resident), window
    3: the lead is two distinct tensors, so the 4 KiB class streams on its in-use
    floor (3 + 1 held by backward) plus 2 buffers, not 3 (one per access)."""
    small = [(f"t{i}", 1, "float32", "param") for i in range(7)]
    big = [(f"t{i}", ALIGN + 1, "float32", "param") for i in range(7, 10)]
    profile = TensorProfile(job_id="j", tensors=small + big, order=["t0", "t0", "t1"])
    budgets = Budgets(fast=12 * ALIGN, host=0)
    plan = build_plan(profile, budgets, window=3, stream_share=1.0)
    check_plan(plan, profile, budgets)
    assert plan.window == 3
    assert plan.buffers[ALIGN] == {"gpu": in_use_floor(ALIGN) + 2} == {"gpu": 6}


def _three_params(sliced: bool) -> TensorProfile:
    """Three 1 MiB parameters, each with two AdamW states: whole (1 MiB each) or
    cut into four 256 KiB slices (`name#kind@k`); forward, then backward with
    each parameter's step right after it."""
    big, piece = 1 << 20, 1 << 18
    tensors, step = [], {}
    for p in ("w", "u", "x"):
        tensors.append((p, big, "float32", "param"))
        ids = []
        for kind in ("exp_avg", "exp_avg_sq"):
            parts = [f"{p}#{kind}@{k}" for k in range(4)] if sliced else [f"{p}#{kind}"]
            tensors += [(t, piece if sliced else big, "float32", kind) for t in parts]
            ids.append(parts)
        step[p] = [t for pair in zip(*ids, strict=True) for t in pair]
    order = ["w", "u", "x"] + [t for p in ("x", "u", "w") for t in (p, *step[p])]
    return TensorProfile(job_id="j", tensors=tensors, order=order)


def test_lone_parameters_found_whatever_their_names_hold() -> None:
    """A parameter's name may hold '#' and '@' (`register_parameter` allows it):
    whole states of `w@0` do not make it lone, sliced states of `v#exp_avg@1` do."""
    tensors = [("w@0", 4096, "float32", "param"), ("v#exp_avg@1", 4096, "float32", "param")]
    for kind in ("exp_avg", "exp_avg_sq"):
        tensors.append((f"w@0#{kind}", 4096, "float32", kind))
        tensors += [(f"v#exp_avg@1#{kind}@{k}", 1024, "float32", kind) for k in range(4)]
    assert lone_params(tensors) == {"v#exp_avg@1"}


def test_parameters_with_sliced_states_need_fewer_buffers() -> None:
    """A class of parameters whose states stream as slices holds at most one in
    its step and one in backward (LONE_FLOOR = 2 buffers), the slices one
    step group of their own (3); whole states need 3 of the big class. The
    check holds the plan to the lower floor and to no less."""
    big, piece = 1 << 20, 1 << 18
    assert lone_params(_three_params(True).tensors) == {"w", "u", "x"}
    assert lone_params(_three_params(False).tensors) == frozenset()
    budgets = Budgets(4 * big, 0)

    def streaming(plan: PrefetchPlan, profile: TensorProfile, size: int) -> int:
        """The class's fast buffers less those of its residents."""
        kept = sum(plan.placement[t] == "gpu" and n == size for t, n, _d, _k in profile.tensors)
        return plan.buffers[size]["gpu"] - kept

    whole = build_plan(_three_params(False), budgets, window=0)
    assert streaming(whole, _three_params(False), big) == in_use_floor(big) == 3
    profile = _three_params(True)
    plan = build_plan(profile, budgets, window=0)
    assert streaming(plan, profile, big) == LONE_FLOOR == 2
    assert streaming(plan, profile, piece) == in_use_floor(piece) == 3
    check_plan(plan, profile, budgets)
    short = msgspec.structs.replace(plan, buffers={**plan.buffers, big: {"gpu": 1}})
    with pytest.raises(PlanError, match="buffers of 1048576 B needed"):
        check_plan(short, profile, budgets)
