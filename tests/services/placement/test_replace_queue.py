"""Re-placement's queue check (services/placement/replace.py, "The queue"): the planned
starts by hand and against a unit-step timeline written independently, and the two
rules on a hand-solved case where a move lets a large job start sooner and delays a
small one behind it."""

from __future__ import annotations

import random

import pytest

from services.placement.replace import planned_starts, queue_allows
from shared.sched.replacement import QueuePlan


def _timeline(
    now: int, free: int, ends: list[tuple[int, int]], waiting: list[tuple[int, int]]
) -> list[float]:
    """The same plan on integer times, one unit step at a time (a second computation)."""
    horizon = now + sum(e for _, e in waiting) + max([t for t, _ in ends] + [now]) + 2
    avail = [free + sum(g for t, g in ends if max(t, now) <= s) for s in range(horizon)]
    out: list[float] = []
    for gpus, est in waiting:
        start = next(
            (
                s
                for s in range(now, horizon - est)
                if all(avail[u] >= gpus for u in range(s, s + est))
            ),
            None,
        )
        if start is None:
            out.append(float("inf"))
            continue
        for u in range(start, start + est):
            avail[u] -= gpus
        out.append(float(start))
    return out


def test_planned_starts_by_hand() -> None:
    # 1 GPU free now, 2 more at t = 10: A (2 GPUs, 5 s) waits for them; B (1, 20 s) fits
    # now beside A's booking; C (1, 5 s) finds no GPU until A ends at 15
    got = planned_starts(0.0, 1, [(10.0, 2)], [(2, 5.0), (1, 20.0), (1, 5.0)])
    assert got == [10.0, 0.0, 15.0]
    # ends before now count as now; a job larger than the cluster never starts
    assert planned_starts(100.0, 0, [(50.0, 2)], [(2, 1.0), (3, 1.0)]) == [100.0, float("inf")]


def test_planned_starts_match_a_unit_step_timeline() -> None:
    rng = random.Random(13)
    for _ in range(300):
        now = rng.randint(0, 5)
        ends = [(rng.randint(0, 40), rng.randint(1, 4)) for _ in range(rng.randint(0, 6))]
        waiting = [(rng.randint(1, 6), rng.randint(1, 15)) for _ in range(rng.randint(1, 8))]
        free = rng.randint(0, 3)
        fl_ends = [(float(t), g) for t, g in ends]
        fl_wait = [(g, float(e)) for g, e in waiting]
        want = _timeline(now, free, ends, waiting)
        assert planned_starts(float(now), free, fl_ends, fl_wait) == want, (now, free, ends)


def test_pareto_refuses_a_move_that_delays_a_small_job_total_allows_it() -> None:
    """Nothing free; another job's GPU is back at 10; the moved job J (1 GPU) would end
    at 20 where it is and at 5 moved. Head H (2 GPUs, 10 s), then S (1 GPU, 6 s).
    Without the move H starts at 20 and S backfills at 10; with it H starts at 10
    and S waits for H's end at 20: H 10 s sooner, S 10 s later."""
    plan = QueuePlan(0.0, 0, [("other", 10.0, 1), ("J", 20.0, 1)], [("H", 2, 10.0), ("S", 1, 6.0)])
    assert planned_starts(0.0, 0, [(10.0, 1), (20.0, 1)], [(2, 10.0), (1, 6.0)]) == [20.0, 10.0]
    assert planned_starts(0.0, 0, [(10.0, 1), (5.0, 1)], [(2, 10.0), (1, 6.0)]) == [10.0, 20.0]
    assert not queue_allows(plan, "J", 1, 20.0, 5.0, "pareto")
    assert queue_allows(plan, "J", 1, 20.0, 5.0, "total")  # 30 s of planned starts both ways
    assert queue_allows(plan, "J", 1, 20.0, 5.0, "off")
    # S short enough to end before H needs its GPU: everyone sooner, both rules allow
    short = QueuePlan(0.0, 0, plan.running, [("H", 2, 10.0), ("S", 1, 4.0)])
    assert queue_allows(short, "J", 1, 20.0, 5.0, "pareto")
    # a move that ends J later (restore longer than the saving) delays H: both refuse
    assert not queue_allows(short, "J", 1, 20.0, 25.0, "pareto")
    assert not queue_allows(short, "J", 1, 20.0, 25.0, "total")


@pytest.mark.parametrize("mode", ["pareto", "total"])
def test_no_waiting_job_means_no_objection(mode: str) -> None:
    assert queue_allows(QueuePlan(0.0, 0, [("J", 9.0, 4)], []), "J", 4, 9.0, 30.0, mode)
