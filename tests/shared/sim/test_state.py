"""Whether a GPU-sharing job fits, answered from a per-type maximum kept until the next
change (`ClusterState`, `GreedyState`, the inversion checker's `_Left`), against a scan of
every GPU, over random claims, releases, placements and takes."""

from __future__ import annotations

import random

import pytest

from shared.cluster import ClusterSpec, NodeSpec
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree
from shared.sched.checker import _Left
from shared.sched.greedy import GreedyState
from shared.sim.state import ClusterState

CLUSTER = ClusterSpec(
    "t",
    (NodeSpec("a", "V100", 4), NodeSpec("b", "P100", 2), NodeSpec("c", "V100", 8),
     NodeSpec("d", "T4", 1), NodeSpec("e", "P100", 4)),
)  # fmt: skip
TYPE_SETS: tuple[frozenset[str], ...] = (
    frozenset(), frozenset({"P100"}), frozenset({"V100"}), frozenset({"T4"}),
    frozenset({"P100", "T4"}), frozenset({"A100"}),
)  # fmt: skip


def _scan(st: ClusterState, num_gpus: int, milli: int, types: frozenset[str]) -> bool:
    """Could the job start alone now: the definition, GPU by GPU."""
    rows = [row for i, row in enumerate(st.free) if not types or st.node_type[i] in types]
    if milli >= FULL_GPU or num_gpus > 1:
        return sum(r.count(FULL_GPU) for r in rows) >= num_gpus
    return any(m >= milli for r in rows for m in r)


@pytest.mark.parametrize("seed", range(25))
def test_fits_is_the_scan_after_every_change(seed: int) -> None:
    rng = random.Random(seed)
    st = ClusterState(CLUSTER)
    held: list[tuple[tuple[tuple[int, tuple[int, ...]], ...], int]] = []
    for step in range(60):
        if held and rng.random() < 0.4:
            claim, milli = held.pop(rng.randrange(len(held)))
            st.release(claim, milli)
        else:
            node = rng.choice(CLUSTER.nodes)
            g = rng.randrange(node.gpus)
            milli = rng.choice([FULL_GPU, 700, 500, 250, 100])
            got = st.claim(Allocation(f"j{step}", ((node.node_id, (g,)),), milli), 1)
            if got is not None:
                held.append((got, milli))
        for _ in range(2):  # asked twice between changes: the kept answer too
            for types in TYPE_SETS:
                for n, m in ((1, 1000), (1, 900), (1, 600), (1, 300), (1, 100), (3, 1000)):
                    assert st.fits(n, m, types) == _scan(st, n, m, types), (step, types, n, m)


def _scan_rows(rows: dict[str, tuple[int, ...]], types: dict[str, str], job: JobRequest) -> bool:
    allowed = [r for n, r in rows.items() if job.allows(types[n])]
    if job.gpu_milli < FULL_GPU and job.num_gpus == 1:
        return any(m >= job.gpu_milli for r in allowed for m in r)
    return sum(r.count(FULL_GPU) for r in allowed) >= job.num_gpus


JOBS = [
    JobRequest(f"q{k}", n, m, types)
    for k, (n, m, types) in enumerate(
        (n, m, t)
        for t in TYPE_SETS
        for n, m in ((1, 1000), (1, 900), (1, 600), (1, 300), (1, 100), (3, 1000))
    )
]


@pytest.mark.parametrize("seed", range(15))
def test_the_greedy_placers_and_the_checkers_fits_are_the_scan(seed: int) -> None:
    """The placers' private copies (`GreedyState`, the inversion checker's `_Left`)
    answer share jobs from a per-type maximum too: against a scan, over random
    placements, gives back and takes."""
    rng = random.Random(seed)
    nodes = [
        NodeFree(
            n.node_id, n.gpu_type, tuple(rng.choice([0, 250, 600, 1000]) for _ in range(n.gpus))
        )
        for n in CLUSTER.nodes
    ]
    kinds = {n.node_id: n.gpu_type for n in CLUSTER.nodes}
    state, left = GreedyState(nodes, {}), _Left(nodes)
    made: list[Allocation] = []
    for step in range(40):
        job = JobRequest(
            f"j{step}", rng.choice([1, 1, 2]), rng.choice([1000, 500, 200]),
            rng.choice(TYPE_SETS[:5]),
        )  # fmt: skip
        if job.num_gpus > 1:
            job = JobRequest(job.job_id, job.num_gpus, FULL_GPU, job.gpu_types)
        if made and rng.random() < 0.3:
            state.untake(made.pop(rng.randrange(len(made))))
        else:
            a = state.place(job)
            if a is not None:
                made.append(a)
                if all(left.free[n][g] >= a.gpu_milli for n, idx in a.gpus for g in idx):
                    left.take(a)
        rows = {state.ids[i]: tuple(r) for i, r in enumerate(state.free)}
        for _ in range(2):
            for q in JOBS:
                assert state.fits(q) == _scan_rows(rows, kinds, q), (step, q)
                assert left.fits(q) == _scan_rows(left.free, kinds, q), (step, q)
