"""The order rule for every placer (shared/sched/ordered.py), over many random
cluster states: a job starts ahead of an earlier one only when the earlier one cannot
start on what the jobs ahead of it were given."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.placement.milp import MilpConfig, MilpPlacer
from services.placement.registry import PLACERS
from shared.placement_api import (
    DISCIPLINES,
    FULL_GPU,
    Allocation,
    JobRequest,
    NodeFree,
    Placer,
    Release,
    RoundContext,
)
from shared.sched.checker import inversions, violations
from shared.sched.greedy import greedy_allocations
from shared.sched.ordered import OrderedPlacer, choose
from tests.services.placement.strategies import TYPES, jobs, nodes

SPEED = {"A": 1.0, "B": 2.0}


def make(name: str) -> Placer:
    if name == "milp":  # reproducible: CP-SAT stops on deterministic time
        return MilpPlacer(MilpConfig(deterministic_time=0.05))
    return PLACERS[name]()


@st.composite
def busy(draw: st.DrawFn) -> tuple[list[NodeFree], RoundContext]:
    """Full nodes whose GPUs come back at drawn times (running jobs' estimated ends)."""
    full = []
    releases = []
    for i in range(draw(st.integers(0, 3))):
        gpus = draw(st.sampled_from((2, 4, 8)))
        node = NodeFree(f"busy{i}", draw(st.sampled_from(TYPES)), (0,) * gpus)
        full.append(node)
        cut = draw(st.integers(1, gpus))
        for part, idx in enumerate((tuple(range(cut)), tuple(range(cut, gpus)))):
            if idx:
                end = float(draw(st.integers(0, 500)))
                releases.append(Release(end, Allocation(f"r{i}.{part}", ((node.node_id, idx),))))
    releases.sort(key=lambda r: r.time_s)
    return full, RoundContext(100.0, releases, {n.node_id: n.gpu_type for n in full})


def estimates(window: list[JobRequest], data: st.DataObject) -> list[JobRequest]:
    return [
        JobRequest(j.job_id, j.num_gpus, j.gpu_milli, j.gpu_types, j.weight, j.score,
                   float(data.draw(st.integers(1, 600))))
        for j in window
    ]  # fmt: skip


def check(
    name: str, discipline: str, cluster: list[NodeFree], window: list[JobRequest], ctx: RoundContext
) -> None:
    placer = OrderedPlacer(make(name), discipline)
    got = placer.place(window, cluster, SPEED, ctx)
    allocs = list(got.allocations)
    assert violations(window, cluster, allocs) == []
    assert inversions(window, cluster, allocs, discipline, ctx) == 0
    started = {a.job_id for a in allocs}
    pos = [i for i, j in enumerate(window) if j.job_id in started]
    waiting = [i for i, j in enumerate(window) if j.job_id not in started]
    if discipline == "strict" and waiting:
        assert all(i < waiting[0] for i in pos)  # nothing passes the first waiting job
    # an independent reading of the rule: the first waiting job does not fit on what the
    # jobs ahead of it were given (exact fit: whole GPUs of its types, or one GPU's share)
    if waiting and any(i > waiting[0] for i in pos):
        head = window[waiting[0]]
        left = {n.node_id: list(n.free_milli) for n in cluster}
        for a in allocs:
            if window.index(next(j for j in window if j.job_id == a.job_id)) < waiting[0]:
                for node_id, idx in a.gpus:
                    for g in idx:
                        left[node_id][g] -= a.gpu_milli
        typ = {n.node_id: n.gpu_type for n in cluster}
        rows = [r for n, r in left.items() if head.allows(typ[n])]
        if head.gpu_milli < FULL_GPU:
            assert not any(f >= head.gpu_milli for r in rows for f in r)
        else:
            assert sum(r.count(FULL_GPU) for r in rows) < head.num_gpus


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    nodes(), jobs(max_jobs=10), busy(), st.sampled_from(sorted(set(PLACERS) - {"milp"})),
    st.sampled_from(DISCIPLINES), st.data(),
)  # fmt: skip
def test_sequential_placers_keep_the_order(
    cluster: list[NodeFree],
    window: list[JobRequest],
    full: tuple[list[NodeFree], RoundContext],
    name: str,
    discipline: str,
    data: st.DataObject,
) -> None:
    check(name, discipline, cluster + full[0], estimates(window, data), full[1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), jobs(max_jobs=8), busy(), st.sampled_from(DISCIPLINES), st.data())
def test_milp_keeps_the_order(
    cluster: list[NodeFree],
    window: list[JobRequest],
    full: tuple[list[NodeFree], RoundContext],
    discipline: str,
    data: st.DataObject,
) -> None:
    check("milp", discipline, cluster + full[0], estimates(window, data), full[1])


def test_milp_packs_a_longer_prefix_than_greedy() -> None:
    """Greedy puts the 2-GPU job on type A (no speeds: types by name) and blocks the
    4-GPU job that may use only A; the MILP places both, so under strict both start."""
    cluster = [NodeFree("b", "A", (FULL_GPU,) * 4), NodeFree("a", "B", (FULL_GPU,) * 2)]
    window = [JobRequest("two", 2), JobRequest("four", 4, gpu_types=frozenset({"A"}))]
    greedy = OrderedPlacer(make("greedy"), "strict").place(window, cluster, {})
    assert [a.job_id for a in greedy.allocations] == ["two"]
    milp = OrderedPlacer(make("milp"), "strict").place(window, cluster, {})
    got = {a.job_id: a.gpus for a in milp.allocations}
    assert got == {"two": (("a", (0, 1)),), "four": (("b", (0, 1, 2, 3)),)}


@st.composite
def repetitive(draw: st.DrawFn) -> list[JobRequest]:
    """A window drawn from a few job kinds, so kinds recur behind the head (as in a
    queue of a real trace), with run-time estimates."""
    kinds = draw(jobs(max_jobs=4))
    n = draw(st.integers(1, 24))
    out = []
    for i in range(n):
        k = draw(st.sampled_from(kinds))
        est = float(draw(st.integers(1, 600)))
        out.append(JobRequest(f"w{i}", k.num_gpus, k.gpu_milli, k.gpu_types, k.weight, 0.0, est))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), repetitive(), busy(), st.sampled_from(DISCIPLINES))
def test_choose_shortcut_equals_the_plain_walk(
    cluster: list[NodeFree],
    window: list[JobRequest],
    full: tuple[list[NodeFree], RoundContext],
    discipline: str,
) -> None:
    """Behind the head, a kind refused since the last start is refused again without
    being judged: the same jobs start, on the same GPUs, as when every one is judged."""
    all_nodes, ctx = cluster + full[0], full[1]
    fast = choose(window, all_nodes, SPEED, discipline, ctx)
    plain = choose(window, all_nodes, SPEED, discipline, ctx, fast=False)
    assert fast == plain


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), repetitive(), busy(), st.sampled_from(DISCIPLINES), st.data())
def test_inversions_shortcut_equals_the_plain_walk(
    cluster: list[NodeFree],
    window: list[JobRequest],
    full: tuple[list[NodeFree], RoundContext],
    discipline: str,
    data: st.DataObject,
) -> None:
    """The checker's walk, cut at the last started job and no longer judging waiting
    jobs once one fitted, counts what the whole walk counts, on placements that keep
    the order and on placements that break it (a random subset placed greedily)."""
    all_nodes, ctx = cluster + full[0], full[1]
    subset = data.draw(st.permutations(window)).copy()[: data.draw(st.integers(0, len(window)))]
    for allocs in (greedy_allocations(subset, all_nodes), choose(window, all_nodes, SPEED,
                                                                 discipline, ctx)[0]):  # fmt: skip
        fast = inversions(window, all_nodes, allocs, discipline, ctx)
        assert fast == inversions(window, all_nodes, allocs, discipline, ctx, fast=False)


def test_refused_for_the_reservation_is_not_refused_for_fitting() -> None:
    """A 2-GPU job that would run past the 8-GPU head's reservation is refused; the next
    2-GPU job ends before it and starts: the shortcut tells the two apart."""
    cluster = [NodeFree("free", "A", (FULL_GPU,) * 4), NodeFree("busy", "A", (0,) * 4)]
    ctx = RoundContext(100.0, [Release(300.0, Allocation("r", (("busy", (0, 1, 2, 3)),)))])
    window = [
        JobRequest("head", 8, est_run_s=10.0),
        JobRequest("long", 2, est_run_s=500.0),
        JobRequest("short", 2, est_run_s=50.0),
        JobRequest("long2", 2, est_run_s=400.0),
    ]
    for fast in (True, False):
        allocs, head, at = choose(window, cluster, SPEED, "easy", ctx, fast=fast)
        assert [a.job_id for a in allocs] == ["short"]
        assert (head, at) == (0, 300.0)
