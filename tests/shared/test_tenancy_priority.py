"""Priority preemption's rule (shared/tenancy.py rule 5, `Quota.preempt_lower`) on
hand-made states worked by hand, and on random states (hypothesis) against a
brute force over every victim set: what it picks keeps every rule, is needed whole,
and it answers None exactly when no set of allowed victims would do."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.tenancy import Quota, Running, Usage, Waiting

V, P = "V100", "P100"
MIN_RUN = 600.0
NOW = 10_000.0


def _quota(queues: dict[str, Any]) -> Quota:
    nodes = [{"name": "v", "gpu_type": V, "gpus": 8}, {"name": "p", "gpu_type": P, "gpus": 8}]
    spec = parse_cluster({"nodes": nodes, "queues": queues})
    return Quota(spec.queues, spec.priority_classes)


def _usage(q: Quota, running: list[Running]) -> Usage:
    u = Usage(q)
    for r in running:
        u.add(r.queue, r.gpus)
    return u


def _r(key: int, queue: str, gpus: dict[str, float], prio: int, started: float,
       preemptible: bool = True) -> Running:  # fmt: skip
    return Running(key, queue, gpus, prio, preemptible, started, key)


FLAT = {"A": {"weight": 1}, "B": {"weight": 1}}


def _keys(got: tuple[str, list[Running]] | None) -> tuple[str, list[int]] | None:
    return None if got is None else (got[0], sorted(r.key for r in got[1]))


def test_lowest_class_then_newest_then_only_what_is_needed() -> None:
    q = _quota(FLAT)
    run = [
        _r(1, "A", {V: 4}, 0, 0.0),  # low, oldest
        _r(2, "A", {V: 2}, 0, 5000.0),  # low, newest
        _r(3, "A", {V: 2}, 3, 8000.0),  # mid, newer still
        _r(4, "A", {P: 8}, 0, 9000.0),  # low, on P100, newest of all
    ]
    u = _usage(q, run)
    job = Waiting("A", 4, frozenset({V}), 5)
    # V100: lowest class first (1 and 2, not 3), newest first: 2 (2 GPUs), then 1 (4):
    # 6 >= 4; then 2 is not needed (1 alone frees 4)
    assert _keys(q.preempt_lower(u, job, run, {V: 0}, NOW, MIN_RUN)) == (V, [1])
    # with 2 GPUs free, 2 (the newest low) is enough
    assert _keys(q.preempt_lower(u, job, run, {V: 2}, NOW, MIN_RUN)) == (V, [2])
    # any type: P100's job 4 ran 1000 s x 8 GPUs = 8000 GPU-s, V100's job 1 ran
    # 10000 s x 4 = 40000: the P100 job is the cheaper loss
    anyt = Waiting("A", 4, frozenset(), 5)
    assert _keys(q.preempt_lower(u, anyt, run, {V: 0, P: 0}, NOW, MIN_RUN)) == (P, [4])


def test_protected_jobs_are_never_victims() -> None:
    q = _quota(FLAT)
    job = Waiting("A", 4, frozenset({V}), 5)
    for r in (
        _r(1, "A", {V: 8}, 5, 0.0),  # equal class
        _r(1, "A", {V: 8}, 9, 0.0),  # higher class
        _r(1, "A", {V: 8}, 0, 0.0, preemptible=False),
        _r(1, "A", {V: 8}, 0, NOW - MIN_RUN + 1),  # inside its minimum run
        _r(1, "B", {V: 8}, 0, 0.0),  # another queue
    ):
        assert q.preempt_lower(_usage(q, [r]), job, [r], {V: 0}, NOW, MIN_RUN) is None, r
    r = _r(1, "A", {V: 8}, 0, NOW - MIN_RUN)  # exactly at its minimum run: may go
    assert _keys(q.preempt_lower(_usage(q, [r]), job, [r], {V: 0}, NOW, MIN_RUN)) == (V, [1])


def test_limits_hold_after_the_preemption() -> None:
    q = _quota({"org": {"limit_gpus": 8}, "A": {"parent": "org", "limit_gpus": 6},
                "B": {"parent": "org"}})  # fmt: skip
    run = [_r(1, "A", {V: 4}, 0, 0.0), _r(2, "B", {V: 4}, 0, 0.0)]
    u = _usage(q, run)
    # 6 wanted: with 1 stopped A holds 6 (<= 6) but the org 4 + 6 = 10 > 8
    assert q.preempt_lower(u, Waiting("A", 6, frozenset({V}), 5), run, {V: 8}, NOW, MIN_RUN) is None
    # 4 wanted: free GPUs are there but the org is at 8; stopping 1 makes room
    got = q.preempt_lower(u, Waiting("A", 4, frozenset({V}), 5), run, {V: 8}, NOW, MIN_RUN)
    assert _keys(got) == (V, [1])
    # it fits as things are: nothing to preempt
    free = Waiting("B", 0.5, frozenset({V}), 5)
    assert _keys(q.preempt_lower(_usage(q, run[:1]), free, run, {V: 4}, NOW, MIN_RUN)) == (V, [])


def test_configuration_per_class_and_cluster_wide() -> None:
    nodes = [{"name": "v", "gpu_type": V, "gpus": 8}]
    classes = {"hi": {"priority": 5, "preempt_lower": True}, "lo": {"priority": 0}}
    spec = parse_cluster({"nodes": nodes, "priority_classes": classes})
    assert (
        spec.priority_classes["hi"].preempt_lower and not spec.priority_classes["lo"].preempt_lower
    )
    every = parse_cluster(
        {"nodes": nodes, "priority_classes": classes, "priority_preemption": True}
    )
    assert every.priority_classes["lo"].preempt_lower
    off = {**classes, "hi": {"priority": 5, "preempt_lower": False}}
    every = parse_cluster({"nodes": nodes, "priority_classes": off, "priority_preemption": True})
    assert not every.priority_classes["hi"].preempt_lower  # the class's own word wins
    with pytest.raises(UserError, match="preempt_lower must be true or false"):
        parse_cluster({"nodes": nodes, "priority_classes": {"x": {"preempt_lower": "yes"}}})
    with pytest.raises(UserError, match="priority_preemption"):
        parse_cluster({"nodes": nodes, "priority_preemption": 1})


# ---- random states against a brute force ------------------------------------------
@st.composite
def _states(draw: st.DrawFn) -> tuple[Quota, Waiting, list[Running], dict[str, float]]:
    org_lim = draw(st.one_of(st.none(), st.integers(2, 16)))
    a_lim = draw(st.one_of(st.none(), st.integers(1, 12)))
    queues: dict[str, Any] = {
        "org": {"limit_gpus": org_lim} if org_lim else {"weight": 1},
        "A": {"parent": "org"} | ({"limit_gpus": a_lim} if a_lim else {}),
        "B": {"parent": "org"},
    }
    q = _quota(queues)
    running = []
    for k in range(draw(st.integers(0, 7))):
        t = draw(st.sampled_from([V, P]))
        running.append(_r(
            k, draw(st.sampled_from(["A", "A", "B"])), {t: float(draw(st.sampled_from([1, 2, 4])))},
            draw(st.integers(0, 4)), float(draw(st.sampled_from([0, 5000, 9000, 9500]))),
            draw(st.sampled_from([True, True, False])),
        ))  # fmt: skip
    free = {V: float(draw(st.integers(0, 4))), P: float(draw(st.integers(0, 4)))}
    types = draw(st.sampled_from([frozenset(), frozenset({V}), frozenset({P})]))
    job = Waiting("A", float(draw(st.sampled_from([1, 2, 4, 8]))), types,
                  draw(st.integers(0, 4)))  # fmt: skip
    return q, job, running, free


def _ok(q: Quota, job: Waiting, run: list[Running], free: dict[str, float], t: str,
        victims: tuple[Running, ...]) -> bool:  # fmt: skip
    """Rule 5 for one victim set, written out again: allowed victims only, the job
    fits the type's free GPUs with theirs, its queue and org within limits after."""
    for r in victims:
        if r.queue != job.queue or r.priority >= job.priority or not r.preemptible:
            return False
        if NOW - r.started_s < MIN_RUN:
            return False
    if free.get(t, 0) + sum(r.gpus.get(t, 0) for r in victims) < job.gpus:
        return False
    held = {"A": 0.0, "B": 0.0}
    for r in run:
        if r not in victims:
            held[r.queue] += sum(r.gpus.values())
    held["A"] += job.gpus
    for name, used in (("A", held["A"]), ("org", held["A"] + held["B"])):
        lim = q.queues[name].limit_gpus
        if lim is not None and used > lim:
            return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_states())
def test_random_states_against_every_victim_set(case: Any) -> None:
    q, job, run, free = case
    got = q.preempt_lower(_usage(q, run), job, run, free, NOW, MIN_RUN)
    types = sorted(job.types or free)
    possible = any(
        _ok(q, job, run, free, t, vs)
        for t in types for n in range(len(run) + 1) for vs in combinations(run, n)
    )  # fmt: skip
    assert (got is not None) == possible
    if got is None:
        return
    t, victims = got
    assert _ok(q, job, run, free, t, tuple(victims))
    # every victim is needed: without any one of them the job does not fit
    for r in victims:
        assert not _ok(q, job, run, free, t, tuple(v for v in victims if v is not r))
