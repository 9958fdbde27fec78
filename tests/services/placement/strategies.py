"""Hypothesis strategies for random cluster states and windows (small, typed)."""

from __future__ import annotations

from hypothesis import strategies as st

from shared.placement_api import FULL_GPU, JobRequest, NodeFree

TYPES = ("A", "B")
SHARES = (100, 250, 300, 470, 500, 650, 810)


@st.composite
def gpu_free(draw: st.DrawFn) -> int:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return 0
    if kind == 1:
        return draw(st.sampled_from((60, 190, 300, 350, 530, 700)))
    return FULL_GPU


@st.composite
def nodes(draw: st.DrawFn, max_nodes: int = 6, max_gpus: int = 8) -> list[NodeFree]:
    n = draw(st.integers(1, max_nodes))
    out = []
    for i in range(n):
        gpus = draw(st.sampled_from((1, 2, 4, 8)[: 1 + max_gpus.bit_length() - 1]))
        free = tuple(draw(gpu_free()) for _ in range(gpus))
        out.append(NodeFree(f"n{i}", draw(st.sampled_from(TYPES)), free))
    return out


@st.composite
def jobs(draw: st.DrawFn, max_jobs: int = 10, max_gpus: int = 8) -> list[JobRequest]:
    n = draw(st.integers(1, max_jobs))
    out = []
    for i in range(n):
        types = frozenset(draw(st.sets(st.sampled_from(TYPES), max_size=2)))
        if draw(st.booleans()):
            out.append(JobRequest(f"j{i}", 1, draw(st.sampled_from(SHARES)), types))
        else:
            k = draw(st.integers(1, max_gpus))
            out.append(
                JobRequest(
                    f"j{i}", k, FULL_GPU, types, weight=draw(st.sampled_from((0.5, 1.0, 2.0)))
                )
            )
    return out
