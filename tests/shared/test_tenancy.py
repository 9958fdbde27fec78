"""The quota rules (shared/tenancy.py) on hand-made states with answers worked by
hand, and over random queue trees (hypothesis) against a few-line reference."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.tenancy import ANY, Quota, Running, Usage, Waiting

V = "V100"


def _quota(queues: dict[str, Any], nodes: list[dict[str, Any]] | None = None) -> Quota:
    nodes = nodes or [{"name": "v", "gpu_type": V, "gpus": 8, "count": 2}]
    spec = parse_cluster({"nodes": nodes, "queues": queues})
    return Quota(spec.queues, spec.priority_classes)


# org A (8 guaranteed, at most 12 held) with teams a1, a2 (4 each); org B with b1 (8)
TREE = {
    "A": {"guaranteed_gpus": 8, "limit_gpus": 12},
    "a1": {"parent": "A", "guaranteed_gpus": 4},
    "a2": {"parent": "A", "guaranteed_gpus": 4},
    "B": {"guaranteed_gpus": 8},
    "b1": {"parent": "B", "guaranteed_gpus": 8},
}


def _usage(q: Quota, running: list[Running]) -> Usage:
    u = Usage(q)
    for r in running:
        u.add(r.queue, r.gpus)
    return u


def _run(
    key: int, queue: str, gpus: float, start: float, prio: int = 0, pre: bool = True
) -> Running:
    return Running(key, queue, {V: gpus}, prio, pre, start, key)


def _keys(
    q: Quota, running: list[Running], job: Waiting, free: float, now: float, min_run: float = 0.0
) -> list[int] | None:
    got = q.reclaim(_usage(q, running), job, running, {V: free}, now, min_run)
    return None if got is None else [r.key for r in got[1]]


def test_limits_hold_at_team_and_org() -> None:
    q = _quota(TREE)
    u = _usage(q, [_run(1, "a1", 4, 0), _run(2, "a2", 2, 0)])  # A holds 6 of its 12
    assert q.limit_reason(u, "a1", {ANY: 6}) is None  # 12: exactly the org's limit
    assert q.limit_reason(u, "a1", {ANY: 7}) == "org A at its limit of 12 GPUs"
    # b1 has no limit: it may borrow the whole cluster
    assert q.limit_reason(u, "b1", {ANY: 16}) is None


def test_reclaim_takes_the_newest_borrower_of_the_other_org() -> None:
    q = _quota(TREE)
    # b1 holds 12 (4 beyond its 8), a2 holds its own 4; nothing free; a1 asks for 4
    running = [
        _run(1, "b1", 4, 0), _run(2, "b1", 4, 100), _run(3, "b1", 4, 200), _run(4, "a2", 4, 50)
    ]  # fmt: skip
    assert _keys(q, running, Waiting("a1", 4), free=0, now=1000) == [3]
    # inside its minimum run time (600 s) the newest is protected: the next one goes
    assert _keys(q, running, Waiting("a1", 4), free=0, now=700, min_run=600) == [2]
    # lowest priority first, before newest first
    low = [_run(1, "b1", 4, 0, prio=0), _run(2, "b1", 4, 100, 5), _run(3, "b1", 4, 200, 5)]
    assert _keys(q, [*low, running[3]], Waiting("a1", 4), free=0, now=1000) == [1]
    # never a non-preemptible job
    nonpre = [running[0], running[1], _run(3, "b1", 4, 200, pre=False), running[3]]
    assert _keys(q, nonpre, Waiting("a1", 4), free=0, now=1000) == [2]
    # a2 is inside its guarantee: when only it could give, nothing is reclaimed
    assert _keys(q, [_run(4, "a2", 4, 0), _run(5, "b1", 8, 0)], Waiting("a1", 8), 4, 1e4) is None


def test_reclaim_only_as_many_as_needed() -> None:
    q = _quota(TREE)
    # b1: a 2-GPU job (newest) and a 4-GPU job borrow; a1 asks for 4 with 0 free
    running = [_run(1, "b1", 8, 0), _run(2, "b1", 4, 10), _run(3, "b1", 2, 20)]
    # newest first takes 3 (2 GPUs) then 2 (4 GPUs): 6 >= 4, and 2 alone is enough
    assert _keys(q, running, Waiting("a1", 4), free=0, now=1e4) == [2]
    # 2 GPUs free: the 2-GPU job alone is enough
    assert _keys(q, running, Waiting("a1", 4), free=2, now=1e4) == [3]
    # it fits already: nothing to preempt
    assert _keys(q, running, Waiting("a1", 4), free=4, now=1e4) == []


def test_two_levels_sibling_first_then_other_org() -> None:
    q = _quota(TREE)
    # a2 holds 8 (4 beyond its 4), b1 exactly its 8: a1's 4 come from its sibling
    running = [_run(5, "a2", 4, 10), _run(6, "a2", 4, 20), _run(7, "b1", 8, 30)]
    assert _keys(q, running, Waiting("a1", 4), free=0, now=1e4) == [6]
    # a2 holds 5 (1 beyond), B holds 11 (3 beyond): the org level opens once the
    # sibling's 1 GPU is taken back (A: 5 -> 4, so a1's 4 fit in A's 8)
    running = [_run(1, "a2", 4, 0), _run(2, "a2", 1, 50), _run(3, "b1", 8, 0), _run(4, "b1", 3, 5)]
    assert _keys(q, running, Waiting("a1", 4), free=0, now=1e4) == [2, 4]


def test_a_team_inside_its_guarantee_is_kept_even_when_its_org_borrows() -> None:
    q = _quota({**TREE, "b1": {"parent": "B", "guaranteed_gpus": 4}, "b2": {"parent": "B"}})
    # B holds 10 of its 8: b1 its own 4 (the newest job), b2 6 beyond its 0
    running = [_run(1, "a2", 4, 0), _run(2, "b1", 4, 300), _run(3, "b2", 6, 0)]
    assert _keys(q, running, Waiting("a1", 4), free=2, now=1e4) == [3]


def test_a_team_with_no_guarantee_uses_its_orgs_unused_one() -> None:
    tree = {k: v for k, v in TREE.items() if k != "a2"}
    q = _quota({**tree, "a3": {"parent": "A"}})
    running = [_run(1, "b1", 8, 0), _run(2, "b1", 8, 1)]  # B borrows 8; A holds nothing
    # a3 has no guarantee of its own, but A's 8 are unused as a whole (4 of them
    # assigned to no team): a3's 2 GPUs fit inside its org's unused guarantee
    assert _keys(q, running, Waiting("a3", 2), free=0, now=1e4) == [2]
    assert _keys(q, running, Waiting("a3", 12), free=0, now=1e4) is None


def test_per_type_guarantee() -> None:
    nodes = [
        {"name": "v", "gpu_type": V, "gpus": 8},
        {"name": "p", "gpu_type": "P100", "gpus": 8},
    ]
    q = _quota({"x": {"guaranteed_gpus": {V: 4}}, "y": {}}, nodes)
    running = [
        Running(1, "y", {V: 4}, started_s=0, order=1),
        Running(2, "y", {V: 4}, started_s=5, order=2),
        Running(3, "y", {"P100": 8}, started_s=9, order=3),
    ]
    u = _usage(q, running)
    # x's guarantee is on V100 only: the P100 job, though newest, is no help
    got = q.reclaim(u, Waiting("x", 4), running, {V: 0, "P100": 0}, 1e4, 0)
    assert got is not None and got[0] == V and [r.key for r in got[1]] == [2]
    # asking for P100 only: no guarantee there, no reclaim
    assert q.reclaim(u, Waiting("x", 4, frozenset({"P100"})), running, {"P100": 0}, 1e4, 0) is None
    # 5 > its 4 guaranteed V100s: no reclaim either
    assert q.reclaim(u, Waiting("x", 5), running, {V: 0, "P100": 0}, 1e4, 0) is None


def test_non_preemptible_starts_only_inside_its_guarantee() -> None:
    q = _quota(TREE)
    u = _usage(q, [_run(1, "a1", 2, 0)])
    assert q.limit_reason(u, "a1", {ANY: 2}, preemptible=False) is None
    assert (
        q.limit_reason(u, "a1", {ANY: 3}, preemptible=False)
        == "non-preemptible: only 2 GPUs of a1's guarantee unused"
    )
    assert q.limit_reason(u, "a1", {ANY: 3}) is None  # a preemptible job may borrow


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ({"A": {"guaranteed_gpus": 4}, "a": {"parent": "A", "guaranteed_gpus": 8}},
         "queues.a.guaranteed_gpus 8 is more than its org A's guaranteed_gpus 4"),
        ({"A": {"guaranteed_gpus": 8}, "a": {"parent": "A", "guaranteed_gpus": 6},
          "b": {"parent": "A", "guaranteed_gpus": 6}},
         "queues.A.guaranteed_gpus 8 is less than its teams' guarantees together (a 6 + b 6)"),
        ({"A": {}, "a": {"parent": "A"}, "x": {"parent": "a"}},
         "queues.x.parent: 'a' has a parent itself ('A'); queues form at most two levels"),
        ({"a": {"parent": "nope"}}, "queues.a.parent: 'nope' is not another queue"),
        ({"a": {"parent": "a"}}, "queues.a.parent: 'a' is not another queue"),
        ({"a": {"guaranteed_gpus": -1}}, "queues.a.guaranteed_gpus must be a number >= 0"),
        ({"a": {"guaranteed_gpus": {V: -2}}}, "queues.a.guaranteed_gpus.V100 must be a number"),
        ({"a": {"guaranteed_gpus": {"A100": 2}}},
         "queues.a.guaranteed_gpus.A100: no GPU type 'A100' in the cluster (types: V100)"),
        ({"a": {"guaranteed_gpus": 10}, "b": {"guaranteed_gpus": 10}},
         "queues: the top-level guaranteed_gpus add up to 20, more than the cluster's 16"),
        ({"a": {"guaranteed_gpus": 4, "limit_gpus": {V: 4}}},
         "queues.a.limit_gpus must be a number >= 0"),
        ({"a": {"owner": "x"}}, "queues.a: unknown key 'owner'"),
    ],
)  # fmt: skip
def test_cluster_file_refuses_a_tree_it_cannot_keep(queues: dict[str, Any], message: str) -> None:
    nodes = [{"name": "v", "gpu_type": V, "gpus": 8, "count": 2}]
    with pytest.raises(UserError) as exc:
        parse_cluster({"nodes": nodes, "queues": queues})
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        ({"x": {"priority": "high"}}, "priority_classes.x.priority must be an integer"),
        ({"x": {"preemptible": "no"}}, "priority_classes.x.preemptible must be true or false"),
        ({"x": {"checkpoint_s": 0}}, "priority_classes.x.checkpoint_s must be a positive"),
        ({"x": {"prio": 1}}, "priority_classes.x: unknown key 'prio'"),
    ],
)
def test_priority_classes_are_checked(classes: dict[str, Any], message: str) -> None:
    nodes = [{"name": "v", "gpu_type": V, "gpus": 8}]
    with pytest.raises(UserError, match=message):
        parse_cluster({"nodes": nodes, "priority_classes": classes})
    ok = parse_cluster(
        {"nodes": nodes, "priority_classes": {"infer": {"priority": 9, "preemptible": False}}}
    )
    assert ok.priority_classes["infer"].priority == 9
    assert not ok.priority_classes["infer"].preemptible


# ---- random trees --------------------------------------------------------------------
CAP = 32  # one GPU type, 4 nodes of 8


@st.composite
def _states(draw: st.DrawFn) -> tuple[Quota, list[Running], Waiting, float, float]:
    queues: dict[str, Any] = {}
    leaves: list[str] = []
    budget = CAP
    for o in range(draw(st.integers(1, 3))):
        org = f"o{o}"
        g_org = draw(st.integers(0, budget))
        budget -= g_org
        lim = draw(st.one_of(st.none(), st.integers(g_org, CAP)))
        queues[org] = {"guaranteed_gpus": g_org, **({"limit_gpus": lim} if lim else {})}
        teams = draw(st.integers(0, 3))
        left = g_org
        for k in range(teams):
            g = draw(st.integers(0, left))
            left -= g
            tl = draw(st.one_of(st.none(), st.integers(g, CAP)))
            queues[f"{org}t{k}"] = {"parent": org, "guaranteed_gpus": g}
            if tl:
                queues[f"{org}t{k}"]["limit_gpus"] = tl
            leaves.append(f"{org}t{k}")
        if not teams:
            leaves.append(org)
    q = _quota(queues, [{"name": "v", "gpu_type": V, "gpus": 8, "count": CAP // 8}])
    running: list[Running] = []
    held = 0
    for k in range(draw(st.integers(0, 12))):
        g = draw(st.sampled_from([1, 2, 4, 8]))
        if held + g > CAP:
            break
        leaf = draw(st.sampled_from(leaves))
        u = _usage(q, running)
        if q.limit_reason(u, leaf, {V: g}) is not None:
            continue  # only states the rules could have produced
        held += g
        running.append(
            Running(k, leaf, {V: g}, draw(st.integers(0, 2)), draw(st.booleans()),
                    float(draw(st.integers(0, 1000))), k)
        )  # fmt: skip
    job = Waiting(draw(st.sampled_from(leaves)), draw(st.sampled_from([1, 2, 4, 8])))
    return q, running, job, float(CAP - held), 1000.0


def _total(running: list[Running], q: Quota, name: str) -> float:
    """GPUs of `name` and of its teams, summed from the jobs (the reference)."""
    return sum(sum(r.gpus.values()) for r in running if name in (r.queue, q.queues[r.queue].parent))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_states())
def test_random_trees_limits_and_reclaim(
    state: tuple[Quota, list[Running], Waiting, float, float],
) -> None:
    q, running, job, free, now = state
    u = _usage(q, running)
    # a start the rules allow never takes a team or its org past a limit
    if q.limit_reason(u, job.queue, {V: job.gpus}) is None:
        after = [*running, Running(99, job.queue, {V: job.gpus})]
        for name, spec in q.queues.items():
            if spec.limit_gpus is not None:
                assert _total(after, q, name) <= spec.limit_gpus
    min_run = 500.0
    got = q.reclaim(u, job, running, {V: free}, now, min_run)
    guar = {n: s.guaranteed_gpus for n, s in q.queues.items()}
    if got is not None:
        victims = got[1]
        for r in victims:
            # never protected, never its own queue, and its queue was borrowing
            assert r.preemptible and now - r.started_s >= min_run and r.queue != job.queue
            assert _total(running, q, r.queue) > guar[r.queue]
        freed = sum(r.gpus[V] for r in victims)
        assert free + freed >= job.gpus
        # and J, started on them, keeps its team and org within their limits
        after = [r for r in running if r not in victims] + [Running(99, job.queue, {V: job.gpus})]
        org = q.top(job.queue)
        lim = q.queues[org].limit_gpus
        if lim is not None and org != job.queue:
            assert _total(after, q, org) <= lim
        # only as many as needed: without any one of them it would not fit (or break
        # the org's limit, or the rules)
        for r in victims:
            rest = [v for v in victims if v is not r]
            short = free + freed - r.gpus[V] < job.gpus
            over_lim = (
                lim is not None and org != job.queue
                and _total([x for x in running if x not in rest], q, org) + job.gpus > lim
            )  # fmt: skip
            assert short or over_lim or not q.valid(u, job, rest, V)
    # the bound: a job that fits its team's unused guarantee finds a reclaim once
    # every borrower may be preempted (guarantees add up to at most the cluster)
    fits_team = _total(running, q, job.queue) + job.gpus <= guar[job.queue]
    if fits_team and all(r.preemptible and now - r.started_s >= min_run for r in running):
        assert got is not None
