"""Fragmentation (ATC'23) and the pieces the MILP is built from."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.placement.baselines import FgdPlacer
from services.placement.classes import enumerate_patterns
from services.placement.frag import PodShape, Workload, node_frag
from services.placement.milp import relevant_nodes
from shared.placement_api import FULL_GPU, JobRequest, NodeFree
from shared.sched.greedy import greedy_allocations
from tests.services.placement.strategies import jobs, nodes


def _direct(free: tuple[int, ...], gpu_type: str, workload: Workload) -> float:
    """F_n(M) straight from the paper's definition, GPU dimension only."""
    total = 0.0
    for shape, p in workload.shapes:
        if not shape.allows(gpu_type):
            total += p * sum(free)
            continue
        fitting = sum(1 for f in free if f >= shape.gpu_milli)
        if fitting >= shape.num_gpus:
            total += p * sum(f for f in free if f < shape.gpu_milli)
        else:
            total += p * sum(free)
    return total


@settings(max_examples=300, deadline=None)
@given(nodes(max_nodes=4), jobs(max_jobs=12))
def test_split_form_equals_definition(cluster: list[NodeFree], window: list[JobRequest]) -> None:
    wl = Workload.of(window)
    for n in cluster:
        got = node_frag(n.free_milli, wl.table(n.gpu_type))
        assert abs(got - _direct(n.free_milli, n.gpu_type, wl)) < 1e-6


def test_hand_computed_fragmentation() -> None:
    # M: half 1-GPU whole pods, half 500-milli shares. Node: GPUs free 1000, 300, 0.
    wl = Workload.of([PodShape(1, FULL_GPU), PodShape(1, 500)])
    # whole pod fits (1 whole GPU): the 300 is a fragment; share fits: 300 too
    assert node_frag((1000, 300, 0), wl.table("X")) == 300.0
    # no whole GPU: a whole pod sees all 800 as fragment; a share fits on the 500
    assert node_frag((500, 300), wl.table("X")) == 0.5 * 800 + 0.5 * 300


def test_fgd_prefers_the_gpu_that_fragments_least() -> None:
    # M = 700-milli shares: a 300 share on the 1000 GPU leaves 700 (usable);
    # on the 600 GPU it leaves 300 (fragment) but removes a 600 fragment: better.
    cluster = [NodeFree("a", "A", (1000, 600))]
    wl = Workload.of([PodShape(1, 700)])
    res = FgdPlacer(wl).place([JobRequest("s", 1, 300)], cluster, {})
    assert res.allocations[0].gpus == (("a", (1,)),)


@given(st.integers(1, 1000), st.lists(st.integers(50, 900), min_size=1, max_size=4, unique=True))
def test_patterns_are_exactly_the_fitting_multisets(cap: int, sizes: list[int]) -> None:
    pats, cut = enumerate_patterns(cap, sizes, [3] * len(sizes), limit=10_000)
    assert not cut
    want = {
        (a, b, c, d)[: len(sizes)]
        for a in range(4)
        for b in range(4 if len(sizes) > 1 else 1)
        for c in range(4 if len(sizes) > 2 else 1)
        for d in range(4 if len(sizes) > 3 else 1)
        if a + b + c + d > 0
        and sum(x * s for x, s in zip((a, b, c, d), sizes, strict=False)) <= cap
    }
    assert set(pats) == want and len(pats) == len(want)


@settings(max_examples=300, deadline=None)
@given(nodes(max_nodes=8), jobs(max_jobs=12))
def test_relevant_nodes_keep_greedy_unchanged(
    cluster: list[NodeFree], window: list[JobRequest]
) -> None:
    # many copies of each node, so that the reduction has something to drop
    many = [
        NodeFree(f"{n.node_id}-{k}", n.gpu_type, n.free_milli) for k in range(6) for n in cluster
    ]
    assert greedy_allocations(window, relevant_nodes(window, many)) == greedy_allocations(
        window, many
    )
