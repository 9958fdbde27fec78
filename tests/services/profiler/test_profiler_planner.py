"""The plan builder: every plan fits every budget, or there is no plan."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offload_agent.device import ALIGN as DEVICE_ALIGN
from services.profiler.planner import (
    ALIGN,
    Budgets,
    PlanError,
    buffer_classes,
    build_plan,
    check_plan,
    in_use_floor,
    size_class,
    step_group,
)
from shared.messages import TensorProfile

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


sizes_st = st.lists(st.integers(1, 300 * KIB), min_size=1, max_size=24)


@settings(max_examples=150, deadline=None)
@given(
    sizes=sizes_st,
    order_idx=st.lists(st.integers(0, 100), max_size=80),
    fast=st.integers(0, 8 << 20),
    host=st.integers(0, 4 << 20),
    window=st.integers(0, 12),
    share=st.floats(0.1, 1.0),
)
def test_plans_respect_every_budget(
    sizes: list[int], order_idx: list[int], fast: int, host: int, window: int, share: float
) -> None:
    profile = _profile(sizes, order_idx)
    budgets = Budgets(fast, host)
    try:
        plan = build_plan(profile, budgets, window=window, stream_share=share)
    except PlanError as exc:
        assert "budget" in str(exc)
        return
    check_plan(plan, profile, budgets)
    gpu = sum(c * t.get("gpu", 0) for c, t in plan.buffers.items())
    hostb = sum(c * t.get("host", 0) for c, t in plan.buffers.items())
    assert gpu <= fast and hostb <= host
    assert set(plan.placement) == {t[0] for t in profile.tensors}
    resident = {t for t, tier in plan.placement.items() if tier == "gpu"}
    assert not resident & set(plan.prefetch)
    assert [t for t in profile.order if t not in resident] == plan.prefetch
    classes = buffer_classes(plan, {t[0]: t[1] for t in profile.tensors})
    for t, c in classes.items():
        assert c >= size_class(dict((x[0], x[1]) for x in profile.tensors)[t])
        assert plan.buffers[c]["gpu"] > 0


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
