"""The greedy placer's best-fit index gives what a scan of every node gives, after any
sequence of placements and give-backs (a reference scan written here)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree
from shared.sched.greedy import GreedyState
from tests.services.placement.strategies import jobs, nodes


def _scan(state: GreedyState, t: str, n: int) -> int:
    """The node of type t in name order with the fewest whole free GPUs >= n."""
    best = -1
    for i in state.by_type[t]:
        w = state.free[i].count(FULL_GPU)
        if w >= n and (best < 0 or w < state.free[best].count(FULL_GPU)):
            best = i
    return best


@given(nodes(max_nodes=12), jobs(max_jobs=16), st.lists(st.integers(0, 15), max_size=6))
def test_best_fit_index_matches_a_scan(
    free: list[NodeFree], window: list[JobRequest], give_back: list[int]
) -> None:
    state = GreedyState(free, {})
    placed: list[Allocation] = []
    for step, job in enumerate(window):
        for t in state.by_type:
            for n in range(1, 9):
                assert state._best_fit(t, n) == _scan(state, t, n)
        a = state.place(job)
        if a is not None:
            placed.append(a)
        if step in give_back and placed:
            state.untake(placed.pop(0))
    for t in state.by_type:
        for n in range(1, 9):
            assert state._best_fit(t, n) == _scan(state, t, n)
