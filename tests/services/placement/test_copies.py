"""What the per-round copies of free capacity may and may not share.

`GreedyState` and `Reservation` read the rows they are handed and copy a row only
when they change it; `GreedyState` reuses the name order of the last nodes it saw;
the simulator's `ClusterState` keeps its free-node list up to date change by change. Each
is checked here against the definition: the rows handed in never change, a snapshot
never moves, a state built after any other gives what a state built from nothing
gives, and the kept list is what a scan of the free rows gives.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.cluster import ClusterSpec, NodeSpec
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree, Release, RoundContext
from shared.sched import greedy
from shared.sched.greedy import GreedyState, greedy_allocations
from shared.sched.reservation import Reservation
from shared.sim.state import ClusterState
from tests.services.placement.strategies import jobs, nodes


def _as_lists(free: list[NodeFree]) -> list[NodeFree]:
    """The same nodes with every other row a list (a caller may hand mutable rows)."""
    return [
        NodeFree(n.node_id, n.gpu_type, list(n.free_milli) if k % 2 else n.free_milli)  # type: ignore[arg-type]
        for k, n in enumerate(free)
    ]


@given(nodes(max_nodes=10), jobs(max_jobs=14), st.lists(st.integers(0, 13), max_size=5))
def test_a_state_never_changes_the_rows_it_was_handed(
    free: list[NodeFree], window: list[JobRequest], give_back: list[int]
) -> None:
    handed = _as_lists(free)
    before = copy.deepcopy([list(n.free_milli) for n in handed])
    state = GreedyState(handed, {})
    placed: list[Allocation] = []
    snaps: list[tuple[dict[str, Sequence[int]], dict[str, tuple[int, ...]]]] = []
    for step, job in enumerate(window):
        snap = state.snapshot()
        snaps.append((snap, {n: tuple(r) for n, r in snap.items()}))
        a = state.place(job)
        if a is not None:
            placed.append(a)
        if step in give_back and placed:
            state.untake(placed.pop(0))
    assert [list(n.free_milli) for n in handed] == before
    for snap, frozen in snaps:  # a snapshot is the state when taken, whatever came after
        assert {n: tuple(r) for n, r in snap.items()} == frozen


@given(nodes(max_nodes=10), jobs(max_jobs=12), st.randoms(use_true_random=False))
def test_a_state_after_others_places_as_a_state_built_from_nothing(
    free: list[NodeFree], window: list[JobRequest], rng: random.Random
) -> None:
    """The kept name order is reused only for the same names and types in the same
    order: after states of shuffled, retyped and reduced node lists, each answer equals
    the one computed with nothing kept."""
    types = [*sorted({n.gpu_type for n in free}), "T4"]
    variants = [free]
    for _ in range(4):
        v = [NodeFree(n.node_id, rng.choice(types), n.free_milli) for n in free]
        rng.shuffle(v)
        variants.append(v[: rng.randint(1, len(v))])
    variants.append(free)
    for v in variants:
        got = greedy_allocations(window, v)
        greedy._last.clear()
        assert got == greedy_allocations(window, v)


def test_a_reservation_never_changes_the_rows_it_was_handed() -> None:
    free: dict[str, list[int]] = {"a": [FULL_GPU, 0], "b": [0, 0, 0, 0], "c": [500, FULL_GPU]}
    before = copy.deepcopy(free)
    ctx = RoundContext(
        now=0.0,
        releases=(
            Release(10.0, Allocation("r1", (("b", (0, 1)),))),
            Release(20.0, Allocation("r2", (("b", (2, 3)),))),
        ),
    )
    types = {"a": "V100", "b": "V100", "c": "V100"}
    head = JobRequest("h", 3, FULL_GPU)
    res = Reservation(head, free, types, ctx, [], {}, {"V100": 2})  # a's and c's whole GPU
    assert (res.at, res.whole) == (10.0, 4)  # and b's first two: 4 whole free at t = 10
    # a job past the reservation on b's released GPUs would leave 2: refused, and undone
    assert not res.allows(Allocation("x", (("b", (0, 1)),)), 50.0)
    assert res.allows(Allocation("y", (("a", (0,)),)), 5.0)  # ends before it: no booking
    assert free == before


CLUSTER = ClusterSpec(
    "t",
    (NodeSpec("a", "V100", 4), NodeSpec("b", "P100", 2), NodeSpec("c", "V100", 8),
     NodeSpec("d", "T4", 1), NodeSpec("e", "P100", 4)),
)  # fmt: skip


@pytest.mark.parametrize("seed", range(10))
def test_free_nodes_is_the_scan_after_every_change(seed: int) -> None:
    rng = random.Random(seed)
    state = ClusterState(CLUSTER)
    held: list[tuple[tuple[tuple[int, tuple[int, ...]], ...], int]] = []
    for step in range(80):
        if held and rng.random() < 0.4:
            claim, milli = held.pop(rng.randrange(len(held)))
            state.release(claim, milli)
        elif rng.random() < 0.8:
            node = rng.choice(CLUSTER.nodes)
            g = rng.randrange(node.gpus)
            milli = rng.choice([FULL_GPU, 700, 500, 250])
            got = state.claim(Allocation(f"j{step}", ((node.node_id, (g,)),), milli), 1)
            if got is not None:
                held.append((got, milli))
        # else: a round without a change, which gets the kept list
        want = [
            NodeFree(n.node_id, n.gpu_type, tuple(row))
            for n, row in zip(CLUSTER.nodes, state.free, strict=True)
            if any(row)
        ]
        first = state.free_nodes()
        assert first == want
        first.clear()  # the caller's list is its own
        assert state.free_nodes() == want
