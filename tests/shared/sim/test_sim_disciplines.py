"""Queueing disciplines in the simulator, against schedules computed independently or
worked out by hand: strict FIFO, and EASY backfill with exact and wrong estimates."""

from __future__ import annotations

import random

import pytest

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cluster import ClusterSpec, parse_cluster
from shared.sim import SimConfig, SimResult, simulate
from shared.traces import TraceJob

TWO_NODES = parse_cluster(
    {"nodes": [{"name": "n", "count": 2, "gpu_type": "P100", "gpus": 4}], "reference": "P100"}
)
ONE_NODE = parse_cluster(
    {"nodes": [{"name": "n", "gpu_type": "P100", "gpus": 4}], "reference": "P100"}
)


def run(
    jobs: list[TraceJob], spec: ClusterSpec, discipline: str, placer: str = "greedy"
) -> SimResult:
    config = SimConfig(discipline=discipline)
    return simulate(jobs, spec, make_policy("fifo"), make_placer(placer, reproducible=True), config)


def starts(r: SimResult) -> dict[str, float]:
    return {rec.job_id: rec.segments[0].start_s for rec in r.records}


def strict_fifo(jobs: list[TraceJob], total: int) -> dict[str, float]:
    """Strict FIFO on `total` interchangeable GPUs, written from the definition: each job
    starts at the first moment, not before the previous job's start, with enough free."""
    running: list[tuple[float, int]] = []  # (finish, GPUs)
    out: dict[str, float] = {}
    t = 0.0
    for j in sorted(jobs, key=lambda j: j.submit_s):
        t = max(t, j.submit_s)
        while total - sum(g for end, g in running if end > t) < j.num_gpus:
            t = min(end for end, _ in running if end > t)
        out[j.job_id] = t
        running.append((t + (j.duration_s or 0.0), j.num_gpus))
    return out


HAND = [  # (id, submit, run, GPUs) on 2 nodes x 4 GPUs
    ("a", 0, 100, 4), ("b", 10, 50, 6), ("c", 20, 10, 1), ("d", 30, 200, 2),
    ("e", 40, 30, 8), ("f", 50, 5, 1), ("g", 60, 40, 3), ("h", 61, 1, 1),
]  # fmt: skip


@pytest.mark.parametrize("placer", ["greedy", "milp"])
def test_fifo_strict_is_strict_fifo_by_hand(placer: str) -> None:
    jobs = [TraceJob(i, float(s), float(d), g) for i, s, d, g in HAND]
    # a runs 0-100; b (6) waits for it, 100-150; c takes 1 of the 2 left, 100-110; d (2)
    # waits for c, 110-310; e (8) needs the whole cluster: after d, 310-340; f, g, h: 340
    want = {"a": 0, "b": 100, "c": 100, "d": 110, "e": 310, "f": 340, "g": 340, "h": 340}
    assert strict_fifo(jobs, 8) == want  # the reference, checked by hand
    r = run(jobs, TWO_NODES, "strict", placer)
    assert starts(r) == want
    assert r.priority_inversions == 0


@pytest.mark.parametrize("seed", range(5))
def test_fifo_strict_matches_the_reference_on_random_traces(seed: int) -> None:
    rng = random.Random(seed)
    jobs = [
        TraceJob(f"j{i}", float(rng.randrange(0, 2000)), float(rng.randrange(1, 300)),
                 rng.choice([1, 1, 2, 3, 4, 6, 8]))
        for i in range(80)
    ]  # fmt: skip
    assert starts(run(jobs, TWO_NODES, "strict")) == strict_fifo(jobs, 8)


def easy_trace(v_run: float) -> list[TraceJob]:
    """Users u (1-GPU jobs of 100 s) and v (1-GPU jobs of 50 s by history) on 4 GPUs.
    S1-S3 start at 200 (estimated end 300); L (4 GPUs) arrives at 210 and is the head:
    its reservation is at 300. V (v, estimated 50 s, really `v_run`) arrives at 220 and
    backfills the free GPU, since by estimate it ends at 270; U1-U5 (u, 100 s) arrive at
    230-270 and would hold a GPU past 300, so they wait behind L."""
    jobs = [
        TraceJob("Wu", 0.0, 100.0, 1, user="u"),
        TraceJob("Wv", 0.0, 50.0, 1, user="v"),
        *(TraceJob(f"S{k}", 200.0, 100.0, 1, user="u") for k in (1, 2, 3)),
        TraceJob("L", 210.0, 1000.0, 4, user="big"),
        TraceJob("V", 220.0, v_run, 1, user="v"),
    ]
    jobs += [TraceJob(f"U{k}", 220.0 + 10 * k, 100.0, 1, user="u") for k in range(1, 6)]
    return jobs


@pytest.mark.parametrize("placer", ["greedy", "milp"])
def test_easy_with_exact_estimates_starts_the_large_job_at_its_reservation(placer: str) -> None:
    r = run(easy_trace(50.0), ONE_NODE, "easy", placer)
    s = starts(r)
    assert s["V"] == 220.0  # backfilled: ends (by estimate, exactly) before the reservation
    assert s["L"] == 300.0  # the reservation: S1-S3's estimated (and real) end
    assert all(s[f"U{k}"] >= 1300.0 for k in range(1, 6))  # none delays L
    assert r.priority_inversions == 0
    # best-effort (no reservation): U1 takes the GPU V frees at 270, U2-U4 the three S1-S3
    # free at 300, U5 U1's at 370, and L starves behind the stream until 470
    b = starts(run(easy_trace(50.0), ONE_NODE, "best-effort", placer))
    assert b["U1"] == 270.0 and b["U5"] == 370.0 and b["L"] == 470.0


def test_easy_with_a_wrong_estimate_slips_the_reservation() -> None:
    """V runs 150 s, not the 50 s its user's history says: it holds its GPU until 370,
    so L's reservation at 300 slips to 370, as in Slurm when a backfilled job overruns;
    U1-U5 still never pass L (the reservation moves with the overrun)."""
    r = run(easy_trace(150.0), ONE_NODE, "easy")
    s = starts(r)
    assert s["V"] == 220.0 and s["L"] == 370.0
    assert all(s[f"U{k}"] >= 1370.0 for k in range(1, 6))
    assert r.priority_inversions == 0


def test_easy_backfills_a_short_job_and_a_late_one_on_the_spare_gpus() -> None:
    """Hand-solved EASY round. History: user s ran 5 s, user l 5,000 s, so an unknown
    user is estimated at their mean, 2,502.5 s. A (4 of 8 GPUs) starts at 6,000 and is
    expected back at 8,502.5; H (6 GPUs) arrives at 6,010, cannot start and reserves
    8,502.5, when 8 GPUs are expected free: 2 spare. S (2 GPUs, estimated 5 s) ends
    before the reservation: it starts. L (2 GPUs, estimated 5,000 s) runs past it, on
    the 2 spare GPUs (S's do not count against the spare): it starts too. M (1 GPU,
    late) finds no GPU free. When S ends (6,015) M would run past the reservation on
    GPUs H needs (L is expected to hold its 2 until 11,010: no spare); when L ends
    (6,110) 2 are spare again and M starts."""
    eight = parse_cluster(
        {"nodes": [{"name": "n", "gpu_type": "P100", "gpus": 8}], "reference": "P100"}
    )
    jobs = [
        TraceJob("W", 0.0, 5000.0, 1, user="l"),
        TraceJob("Q", 0.0, 5.0, 1, user="s"),
        TraceJob("A", 6000.0, 100_000.0, 4, user="a"),
        TraceJob("H", 6010.0, 10.0, 6, user="h"),
        TraceJob("S", 6010.0, 5.0, 2, user="s"),
        TraceJob("L", 6010.0, 100.0, 2, user="l"),
        TraceJob("M", 6010.0, 100.0, 1, user="l"),
    ]
    want = {"S": 6010.0, "L": 6010.0, "M": 6110.0}
    for exhaustive in (False, True):
        config = SimConfig(discipline="easy", exhaustive=exhaustive)
        r = simulate(jobs, eight, make_policy("fifo"), make_placer("greedy"), config)
        got = starts(r)
        assert {k: got[k] for k in want} == want
        assert got["H"] == 106_000.0  # when A ends (its estimate was wrong: it slipped)
        assert r.priority_inversions == 0
