"""The EASY fifo shadow behind `--bound-scale fifo`: turns against a hand-solved
instance and against a plain multi-server FIFO queue written here, and the policy
putting a large job ahead exactly when its turn has come."""

from __future__ import annotations

import functools
import heapq

import numpy as np

from services.scoring.rl import RLPolicy
from services.scoring.rl.shadow import FifoShadow
from shared.policy_api import History, PolicyContext, QueuedJob
from shared.policy_features import JOB_FEATURES
from tests.services.scoring.test_rl_policy import CLUSTER, _net, _obs, _Steps


def _job(seq: int, submit: float, gpus: int, who: str = "") -> QueuedJob:
    return QueuedJob(seq, f"j{seq}", submit, gpus, vc=who or f"v{seq}")


def test_turns_of_a_hand_solved_easy_queue() -> None:
    """8 GPUs. t=0: A (4 GPUs, est 100) starts; B (8, est 50) cannot, becomes the head
    and is reserved t=100 (A's release). t=10: C (2, est 50) backfills (ends 60 <= 100).
    t=20: D (2, est 200) fits the 2 free GPUs but would end at 220 > 100 with no GPU
    spare at the reservation: it waits; at 60 (C ends) the same. t=100: A ends, B
    starts, D becomes the head. t=150: B ends, D starts.
    Turns (head or start, whichever first): A 0, B 0, C 10, D 100."""
    est = {0: 100.0, 1: 50.0, 2: 50.0, 3: 200.0}
    jobs = [_job(0, 0.0, 4), _job(1, 0.0, 8), _job(2, 10.0, 2), _job(3, 20.0, 2)]
    s = FifoShadow()
    for j in jobs:
        s.add(j)
    s.advance(99.0, 8, lambda j: est[j.seq])
    assert [s.turn(j.seq) for j in jobs] == [0.0, 0.0, 10.0, None]
    s.advance(100.0, 8, lambda j: est[j.seq])
    assert s.turn(3) == 100.0
    assert s.free == 0.0  # B holds all 8 (C ended at 60, A at 100)
    s.advance(150.0, 8, lambda j: est[j.seq])
    assert s.free == 6.0  # D runs
    s.forget(3)  # left the real queue: its turn is dropped
    assert s.turn(3) is None and s.turn(0) == 0.0
    # a job that leaves the real queue before its turn never gets one (D again)
    s = FifoShadow()
    for j in jobs:
        s.add(j)
    s.advance(99.0, 8, lambda j: est[j.seq])
    s.forget(3)
    s.advance(200.0, 8, lambda j: est[j.seq])
    assert s.turn(3) is None and s.free == 6.0  # D: the head at 100, runs 150-350


def _run_of(runs: np.ndarray, job: QueuedJob) -> float:
    return float(runs[job.seq])


def test_turns_equal_a_multi_server_fifo_queue_for_one_gpu_jobs() -> None:
    """With every job asking one GPU nothing can backfill (when the head does not
    fit no GPU is free), so EASY is FIFO on `total` servers: a job becomes the head
    when the one before it starts (or when it arrives), and starts at the earliest
    server release after that. The reference below is that queue, written directly."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        total = int(rng.integers(1, 5))
        n = int(rng.integers(1, 30))
        submits = np.sort(rng.integers(0, 400, n)).astype(float)
        runs = rng.integers(1, 200, n).astype(float)
        servers = [0.0] * total  # release times
        want, last_start = [], -np.inf
        for sub, run in zip(submits, runs, strict=True):
            head = max(sub, last_start)
            start = max(head, heapq.heappop(servers))
            heapq.heappush(servers, start + run)
            want.append(min(head, start))
            last_start = start
        s = FifoShadow()
        for i, sub in enumerate(submits):
            s.add(_job(i, float(sub), 1))
        s.advance(1e9, total, functools.partial(_run_of, runs))
        assert [s.turn(i) for i in range(n)] == want


def test_a_large_job_goes_ahead_when_its_fifo_turn_comes() -> None:
    """6 GPUs; estimates from history: VC a's 4-GPU jobs 2000 s, b's 500 s, c's 2-GPU
    jobs 300 s. Shadow: J0 (a, 4 GPUs, t=0) starts and runs to 2000; J1 (b, 4, t=100)
    is the head from 100, reserved 2000; J2 (c, 2, t=200) backfills (ends 500);
    J3 (d, 4, t=300) is behind J1 and becomes the head only at 2000 when J1 starts.
    At 1000 s the bound puts J0 and J1 ahead (their turns came) and leaves J3, which
    has waited 700 s, to the network; at 2100 s J3 goes ahead too. A fixed 300 s
    bound would put J3 ahead at 1000 s already."""
    history = History()
    for vc, gpus, run in (("a", 4, 2000.0), ("b", 4, 500.0), ("c", 2, 300.0)):
        history.record(QueuedJob(99, "done", 0.0, gpus, vc=vc), run)
    jobs = [_job(0, 0.0, 4, "a"), _job(1, 100.0, 4, "b"), _job(2, 200.0, 2, "c"),
            _job(3, 300.0, 4, "d")]  # fmt: skip
    p = RLPolicy(_net(), JOB_FEATURES, bound_gpus=4, bound_scale="fifo")
    p.reset(PolicyContext(CLUSTER, history))
    for j in jobs:
        p.add(j)
    steps: list = []
    p.recorder = _Steps(steps)
    obs = _obs(history, jobs)  # now = 1000
    assert [j.seq for j in p.window(4, obs)][:2] == [0, 1]
    assert sorted(steps[-1].pool) == [2, 3]
    obs.now = 2100.0
    assert [j.seq for j in p.window(4, obs)][:3] == [0, 1, 3]
    assert steps[-1].pool == [2]
    p.remove(jobs[0])
    assert [j.seq for j in p.window(3, obs)][:2] == [1, 3]
    fixed = RLPolicy(_net(), JOB_FEATURES, max_wait_s=300.0, bound_gpus=4)
    fixed.reset(PolicyContext(CLUSTER, history))
    for j in jobs:
        fixed.add(j)
    obs.now = 1000.0
    assert [j.seq for j in fixed.window(4, obs)][:3] == [0, 1, 3]


def test_fifo_head_puts_a_large_job_ahead_only_when_it_is_the_oldest() -> None:
    """J0 (1 GPU, oldest), J1 and J2 (4 GPUs each). While J0 waits nothing goes ahead
    (the head EASY fifo reserves for is small); once it has started, J1 is the head
    and goes ahead, J2 does not (it is behind J1 in fifo's order) however long it
    has waited. A cap puts a job ahead past it whatever its place (850 s: J1; 750 s: both)."""
    history = History()
    jobs = [_job(0, 0.0, 1), _job(1, 100.0, 4), _job(2, 200.0, 4)]
    for cap, want in ((None, [[], [1]]), (850.0, [[1], [1]]), (750.0, [[1, 2], [1, 2]])):
        p = RLPolicy(_net(), JOB_FEATURES, max_wait_s=cap, bound_gpus=4, bound_scale="fifo-head")
        p.reset(PolicyContext(CLUSTER, history))
        for j in jobs:
            p.add(j)
        obs = _obs(history, jobs)  # now = 1000: J1 waited 900 s, J2 800 s
        got = [[j.seq for j in p.forced(obs)]]
        p.remove(jobs[0])
        got.append([j.seq for j in p.forced(obs)])
        assert got == want
