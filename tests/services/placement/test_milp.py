"""The MILP: a hand-solved instance, brute-force optimality on small instances,
the timeout and fallback paths, and a real-cluster window."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from services.placement import milp_model
from services.placement.classes import slot_gpus
from services.placement.milp import MilpConfig, MilpPlacer, _split
from services.placement.objective import Scorer
from services.placement.state import apply_allocations
from shared.cluster import load_cluster
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree
from shared.sched.checker import violations
from shared.sched.greedy import greedy_allocations
from shared.traces import SkipStats
from shared.traces.alibaba2023 import read_alibaba2023
from tests.paths import ALIBABA_2023
from tests.services.placement.strategies import gpu_free, jobs, nodes

SPEED = {"A": 1.0, "B": 2.0}
TRACES = ALIBABA_2023


def test_hand_solved_instance() -> None:
    # Greedy (no speeds: types by name) puts the 2-GPU job on the 4-GPU node b of
    # type A and then cannot start the 4-GPU job (type A only). The optimum starts all
    # four: 2 on a, 4 on b, 300 on c:1, 700 on c:0.
    cluster = [
        NodeFree("b", "A", (1000,) * 4),
        NodeFree("a", "B", (1000, 1000)),
        NodeFree("c", "C", (700, 300)),
    ]
    only_c = frozenset({"C"})
    window = [
        JobRequest("two", 2),
        JobRequest("four", 4, gpu_types=frozenset({"A"})),
        JobRequest("s300", 1, 300, only_c),
        JobRequest("s700", 1, 700, only_c),
    ]
    greedy = {a.job_id for a in greedy_allocations(window, cluster)}
    assert greedy == {"two", "s300", "s700"}
    res = MilpPlacer(MilpConfig(time_limit_s=2.0)).place(window, cluster, {})
    got = {a.job_id: a.gpus for a in res.allocations}
    assert res.status == "OPTIMAL"
    assert got == {
        "two": (("a", (0, 1)),),
        "four": (("b", (0, 1, 2, 3)),),
        "s300": (("c", (1,)),),
        "s700": (("c", (0,)),),
    }


def _best(window: list[JobRequest], cluster: list[NodeFree], scorer: Scorer) -> int:
    """Brute force over single-node placements: every job off, or on any node it
    fits (whole GPUs are interchangeable, shares differ only by the GPU's free)."""
    best = 0

    def rec(i: int, free: list[list[int]], chosen: list[Allocation]) -> None:
        nonlocal best
        if i == len(window):
            best = max(best, scorer.evaluate(chosen))
            return
        rec(i + 1, free, chosen)
        job = window[i]
        for n, node in enumerate(cluster):
            if not job.allows(node.gpu_type):
                continue
            for idx in _options(job, free[n]):
                for g in idx:
                    free[n][g] -= job.gpu_milli
                chosen.append(Allocation(job.job_id, ((node.node_id, idx),), job.gpu_milli))
                rec(i + 1, free, chosen)
                chosen.pop()
                for g in idx:
                    free[n][g] += job.gpu_milli

    rec(0, [list(n.free_milli) for n in cluster], [])
    return best


def _options(job: JobRequest, row: list[int]) -> Iterator[tuple[int, ...]]:
    if job.gpu_milli < FULL_GPU:
        seen: set[int] = set()
        for g, f in enumerate(row):
            if f >= job.gpu_milli and f not in seen:
                seen.add(f)
                yield (g,)
        return
    whole = [g for g, f in enumerate(row) if f >= FULL_GPU]
    if len(whole) >= job.num_gpus:
        yield tuple(whole[: job.num_gpus])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(max_nodes=3, max_gpus=4), jobs(max_jobs=5, max_gpus=4))
@example(  # j2 (any type) and j4 (B only) fit only B: one job class charged j2's type penalty
    cluster=[NodeFree("n0", "B", (0, 0, 1000, 1000)), NodeFree("n1", "A", (60,))],
    window=[
        JobRequest("j0", 1, 250),
        JobRequest("j1", 1, 250),
        JobRequest("j2", 1, FULL_GPU),
        JobRequest("j3", 1, 250),
        JobRequest("j4", 1, FULL_GPU, frozenset({"B"})),
    ],
)
def test_objective_equals_brute_force(cluster: list[NodeFree], window: list[JobRequest]) -> None:
    _, multi = _split(window, cluster)
    assume(not multi)  # multi-node jobs are spread after the solve, not optimised
    placer = MilpPlacer(MilpConfig(time_limit_s=5.0))
    res = placer.place(window, cluster, SPEED)
    assert res.status == "OPTIMAL"
    assert violations(window, cluster, res.allocations) == []
    ref = placer.scorer(window, cluster, SPEED)  # same objective, over every node
    scorer = Scorer(window, cluster, SPEED, ref.weights, ref.workload, ref.pressure)
    assert res.objective == scorer.evaluate(res.allocations)
    assert res.objective == _best(window, cluster, scorer)


class _Toy:
    """A same-window contention (objective.py's Contention): jobs whose id ends in an
    even digit stream; a node of type t receiving streaming slots pays
    w_t · Σ_slots k · (o − k), o its streaming GPUs in all."""

    def __init__(self, w: dict[str, int] | None = None) -> None:
        self.w = w or {"A": 300, "B": 170}

    def kind(self, job: JobRequest) -> int:
        return 1 if job.job_id[-1] in "02468" else 0

    def cost(self, gpu_type: str, slots: Sequence[tuple[int, int]]) -> int:
        o = sum(slot_gpus(key) * c for key, c in slots)
        return self.w.get(gpu_type, 90) * sum(
            c * slot_gpus(key) * (o - slot_gpus(key)) for key, c in slots
        )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(max_nodes=3, max_gpus=4), jobs(max_jobs=5, max_gpus=4))
def test_objective_with_same_window_contention_equals_brute_force(
    cluster: list[NodeFree], window: list[JobRequest]
) -> None:
    """Streaming slots as their own slot kind, each node pattern charged what its
    streaming slots cost each other: still the exact optimum of the objective that
    Scorer.evaluate computes for a concrete placement (brute force over placements)."""
    _, multi = _split(window, cluster)
    assume(not multi)
    placer = MilpPlacer(MilpConfig(time_limit_s=5.0, enumerate_single=False))
    res = placer.place_charged(window, cluster, SPEED, lambda j, t: 0, _Toy())
    assert res.status == "OPTIMAL"
    assert violations(window, cluster, res.allocations) == []
    ref = placer.scorer(window, cluster, SPEED)
    scorer = Scorer(window, cluster, SPEED, ref.weights, ref.workload, ref.pressure, None, _Toy())
    assert res.objective == scorer.evaluate(res.allocations)
    assert res.objective == _best(window, cluster, scorer)


def test_contention_moves_streaming_jobs_apart() -> None:
    """Two 1-GPU streaming jobs and two 2-GPU nodes of one type: packing (least
    fragmentation) puts both on one node; a contention dearer than the fragmentation
    saved puts them on two, a cheap one does not."""
    cluster = [NodeFree("m", "A", (1000, 1000)), NodeFree("n", "A", (1000, 1000))]
    window = [JobRequest("j0", 1), JobRequest("j2", 1)]
    placer = MilpPlacer(MilpConfig(time_limit_s=5.0))
    assert len({a.node_ids for a in placer.place(window, cluster, SPEED).allocations}) == 1
    res = placer.place_charged(window, cluster, SPEED, lambda j, t: 0, _Toy({"A": 100_000}))
    assert sorted(a.node_ids for a in res.allocations) == [("m",), ("n",)]
    res = placer.place_charged(window, cluster, SPEED, lambda j, t: 0, _Toy({"A": 0}))
    assert len({a.node_ids for a in res.allocations}) == 1


def _window() -> tuple[list[JobRequest], list[NodeFree]]:
    cluster = [NodeFree(f"n{i}", "AB"[i % 2], (1000,) * 8) for i in range(40)]
    cluster += [NodeFree(f"p{i}", "A", (300, 1000, 650, 0)) for i in range(20)]
    window = [JobRequest(f"j{i}", 1 + i % 4, FULL_GPU) for i in range(30)]
    window += [JobRequest(f"s{i}", 1, (230, 470, 810)[i % 3]) for i in range(30)]
    return window, cluster


def test_timeout_returns_feasible_answer() -> None:
    window, cluster = _window()
    res = MilpPlacer(MilpConfig(time_limit_s=0.0, min_solve_s=0.0005)).place(window, cluster, {})
    assert res.status in ("TIMEOUT_FEASIBLE", "TIMEOUT_HINT", "OPTIMAL")
    assert violations(window, cluster, res.allocations) == []
    assert len(res.allocations) == len(window)


def test_no_solution_falls_back_to_greedy(monkeypatch: pytest.MonkeyPatch) -> None:
    window, cluster = _window()
    monkeypatch.setattr(
        milp_model.WindowModel,
        "solve",
        lambda self, limit, workers: milp_model.SolveOutcome("UNKNOWN", (), 0.0, False, 0),
    )
    res = MilpPlacer().place(window, cluster, {})
    assert res.status == "FALLBACK_GREEDY"
    assert list(res.allocations) == greedy_allocations(window, cluster)


def test_multi_node_job_spread_on_fewest_nodes() -> None:
    cluster = [NodeFree("a", "A", (1000,) * 4), NodeFree("b", "A", (1000,) * 8)]
    cluster.append(NodeFree("c", "A", (1000,) * 2))
    # a wall-clock limit far above the solve: under load the default 36 ms can end
    # the search before optimality is proven, and this checks the optimum
    res = MilpPlacer(MilpConfig(time_limit_s=10.0)).place([JobRequest("big", 10)], cluster, {})
    (alloc,) = res.allocations
    assert len(alloc.gpus) == 2 and alloc.gpus[0] == ("b", tuple(range(8)))  # 8 + 2: fewest
    assert res.status == "OPTIMAL" and alloc.gpus[1][0] == "c"  # the 2 from c keeps a's 4 whole
    assert violations([JobRequest("big", 10)], cluster, res.allocations) == []


def test_real_cluster_window_beats_greedy() -> None:
    spec = load_cluster(TRACES / "openb_node_list_gpu_node.csv")
    cluster = [NodeFree(n.node_id, n.gpu_type, (FULL_GPU,) * n.gpus) for n in spec.nodes]
    reader = read_alibaba2023(TRACES / "openb_pod_list_gpuspec20.csv", SkipStats())
    pods = [
        JobRequest(p.job_id, p.num_gpus, p.gpu_milli, frozenset(p.gpu_types))
        for p in itertools.islice(reader, 96)
    ]

    cluster = apply_allocations(cluster, greedy_allocations(pods[:64], cluster))
    window = pods[64:]
    placer = MilpPlacer(MilpConfig(time_limit_s=2.0))
    res = placer.place(window, cluster, {})
    assert violations(window, cluster, res.allocations) == []
    ref = placer.scorer(window, cluster, {})
    scorer = Scorer(window, cluster, {}, ref.weights, ref.workload, ref.pressure)
    assert res.objective is not None
    assert res.objective >= scorer.evaluate(greedy_allocations(window, cluster))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(max_nodes=6), jobs(max_jobs=1))
def test_one_job_scored_by_enumeration_equals_the_model(
    cluster: list[NodeFree], window: list[JobRequest]
) -> None:
    _, multi = _split(window, cluster)
    assume(not multi)
    fast = MilpPlacer(MilpConfig(deterministic_time=1.0)).place(window, cluster, SPEED)
    model = MilpPlacer(MilpConfig(deterministic_time=1.0, enumerate_single=False))
    slow = model.place(window, cluster, SPEED)
    assert fast.extra.get("enumerated") == 1.0 and slow.status == "OPTIMAL"
    assert fast.objective == slow.objective
    assert violations(window, cluster, fast.allocations) == []
    scorer = MilpPlacer().scorer(window, cluster, SPEED, reduce=False)
    assert fast.objective == scorer.evaluate(fast.allocations)


def _renamed(
    window: list[JobRequest], cluster: list[NodeFree], tag: str
) -> tuple[list[JobRequest], list[NodeFree]]:
    """The same window and cluster under other names (node names keep their order)."""
    jobs_ = [
        JobRequest(f"{tag}{j.job_id}", j.num_gpus, j.gpu_milli, j.gpu_types, j.weight)
        for j in window
    ]
    return jobs_, [NodeFree(f"{tag}{n.node_id}", n.gpu_type, n.free_milli) for n in cluster]


@st.composite
def states(draw: st.DrawFn) -> list[tuple[list[NodeFree], list[JobRequest]]]:
    """Rounds on one cluster: its free GPUs drawn afresh each round, the window one of
    two (so that windows and shapes recur, as in a simulation)."""
    skeleton = draw(nodes(max_nodes=5))
    windows = [draw(jobs(max_jobs=5)), draw(jobs(max_jobs=5))]
    out = []
    for _ in range(draw(st.integers(1, 6))):
        cluster = [
            NodeFree(n.node_id, n.gpu_type, tuple(draw(gpu_free()) for _ in n.free_milli))
            for n in skeleton
        ]
        out.append((cluster, draw(st.sampled_from(windows))))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states())
def test_memoised_answers_equal_fresh_solves(
    rounds: list[tuple[list[NodeFree], list[JobRequest]]],
) -> None:
    """A reproducible placer that remembers solved windows (by shapes, names left out)
    answers each window, seen before under other names or not, exactly as a placer
    solving it afresh: same GPUs for the same jobs, same status and objective."""
    memo = MilpPlacer(MilpConfig(deterministic_time=0.05))
    for i, (cluster, window) in enumerate(rounds * 2):
        window, cluster = _renamed(window, cluster, f"r{i}.")
        got = memo.place(window, cluster, SPEED)
        want = MilpPlacer(MilpConfig(deterministic_time=0.05)).place(window, cluster, SPEED)
        assert got.allocations == want.allocations
        assert (got.status, got.objective) == (want.status, want.objective)
        if i >= len(rounds) and "enumerated" not in want.extra:
            assert got.extra.get("memo") == 1.0  # the second pass is remembered
