"""Each baseline policy's order on literal inputs (Gavel-style: inputs in, order out)."""

from __future__ import annotations

import pytest

from services.scoring.policies import BASELINES, make_policy
from services.scoring.policies.las import THRESHOLDS, Las
from services.scoring.policies.multifactor import MAX_AGE_S, Multifactor
from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.policy_api import History, Policy, QueuedJob, policy_context

CLUSTER = parse_cluster({"nodes": [{"name": "n", "count": 2, "gpu_type": "P100", "gpus": 8}]})


class Obs:
    """A hand-set Observation."""

    def __init__(self, now: float = 0.0, vc_held: dict[str, float] | None = None) -> None:
        self.now = now
        self.history = History()
        self._vc = vc_held or {}
        self.gpu_types = ("P100",)

    def total_gpus(self, gpu_type: str | None = None) -> int:
        return 16

    def free_gpus(self, gpu_type: str | None = None) -> int:
        return 0

    def waiting_gpus(self, gpu_type: str | None = None) -> float:
        return 0.0

    def fragmentation(self, gpu_type: str | None = None) -> float:
        return 0.0

    def vc_gpus(self, vc: str) -> float:
        return self._vc.get(vc, 0.0)

    def queue_length(self) -> int:
        return 0


def J(seq: int, submit: float, gpus: int = 1, **kw: object) -> QueuedJob:
    return QueuedJob(seq, f"j{seq}", submit, gpus, **kw)  # type: ignore[arg-type]


RUN_S = {0: 50.0, 1: 10.0, 2: 30.0, 3: 10.0}
JOBS = [J(0, 0.0, 4, vc="a"), J(1, 1.0, 1, vc="b"), J(2, 2.0, 2, vc="a"), J(3, 3.0, 1, vc="b")]


def order(policy: Policy, jobs: list[QueuedJob], obs: Obs, k: int = 10, seed: int = 0) -> list[int]:
    policy.reset(policy_context(policy, CLUSTER, obs.history, seed, lambda j: RUN_S[j.seq]))
    for j in jobs:
        policy.add(j)
    return [j.seq for j in policy.window(k, obs)]


def test_fifo_smallest_and_oracle() -> None:
    assert order(make_policy("fifo"), JOBS, Obs()) == [0, 1, 2, 3]
    assert order(make_policy("smallest"), JOBS, Obs()) == [1, 3, 2, 0]
    assert order(make_policy("sjf-oracle"), JOBS, Obs()) == [1, 3, 2, 0]
    assert make_policy("sjf-oracle").label == "sjf-oracle (oracle)"
    assert [p for p in BASELINES if make_policy(p).oracle] == ["sjf-oracle", "f1-oracle"]


def test_window_is_the_first_k_and_remove_works() -> None:
    p = make_policy("fifo")
    assert order(p, JOBS, Obs(), k=2) == [0, 1]
    p.remove(JOBS[0])
    assert [j.seq for j in p.window(2, Obs())] == [1, 2]


def test_sjf_est_uses_only_same_group_history() -> None:
    obs = Obs()
    h = obs.history
    h.record(QueuedJob(90, "x", 0.0, 4, vc="a"), 100.0)  # a, 4 GPUs: mean 100
    h.record(QueuedJob(91, "y", 0.0, 1, vc="b"), 500.0)  # b, 1 GPU: mean 500
    # j2 (a, 2 GPUs) has no history of its own: estimate 0, first; then a/4 (100), then b/1
    assert order(make_policy("sjf-est"), JOBS, obs) == [2, 0, 1, 3]


def test_drf_favours_the_vc_holding_least() -> None:
    assert order(make_policy("drf"), JOBS, Obs(vc_held={"a": 8.0, "b": 2.0})) == [1, 3, 0, 2]
    assert order(make_policy("drf"), JOBS, Obs(vc_held={"a": 0.0, "b": 2.0})) == [0, 2, 1, 3]
    assert order(make_policy("drf"), JOBS, Obs()) == [0, 1, 2, 3]  # tied shares: FIFO


def test_multifactor_by_hand() -> None:
    now = 3 * 86400.0
    # priority = 1000 * age/7d + 1000 * (1 - (n - 1)/16)
    p = [Multifactor.priority(j, now, 16) for j in JOBS]
    assert p[0] == pytest.approx(1000 * (now - 0) / MAX_AGE_S + 1000 * (1 - 3 / 16))
    assert order(make_policy("multifactor"), JOBS, Obs(now=now)) == [1, 3, 2, 0]
    # a 4-GPU job 7 days older than the rest outranks them
    old = [J(0, -7 * 86400.0, 4), J(1, 0.0, 1)]
    assert order(make_policy("multifactor"), old, Obs(now=1.0)) == [0, 1]


def test_f1_by_hand() -> None:
    # score = log10(r) * n + 870 * log10(s); r = 3600 (no history); s = submit - first + 1
    jobs = [J(0, 0.0, 1), J(1, 0.0, 64), J(2, 9.0, 1)]
    # j0: 3.556; j1: 227.6; j2: 3.556 + 870 = 873.6
    assert order(make_policy("f1"), jobs, Obs()) == [0, 1, 2]


def test_f1_oracle_by_hand() -> None:
    # f1's rule on the true run time (RUN_S): log10(r) * n + 870 * log10(s), s = submit - 0 + 1
    # j0: log10(50) * 4 + 0 = 6.796; j1: 1 + 870 log10(2) = 262.9;
    # j2: log10(30) * 2 + 870 log10(3) = 2.954 + 415.1 = 418.1; j3: 1 + 870 log10(4) = 524.8
    assert order(make_policy("f1-oracle"), JOBS, Obs()) == [0, 1, 2, 3]
    # a 64-GPU job that runs 1e4 s (4 x 64 = 256) stays ahead of a 1-GPU job of 10 s
    # submitted 1 s later (1 + 870 log10(2) = 262.9); one that runs 1e5 s (5 x 64 = 320)
    # goes behind it
    jobs = [J(0, 0.0, 64), J(1, 1.0, 1)]
    run = {0: 1e4, 1: 10.0}
    for r0, want in ((1e4, [0, 1]), (1e5, [1, 0])):
        run[0] = r0
        p = make_policy("f1-oracle")
        p.reset(policy_context(p, CLUSTER, History(), 0, lambda j: run[j.seq]))
        for j in jobs:
            p.add(j)
        assert [j.seq for j in p.window(2, Obs())] == want
    # f1 itself, with no history, ranks both on one hour: 64 x 3.556 = 227.6 < 262.9
    assert order(make_policy("f1"), jobs, Obs()) == [0, 1]
    assert make_policy("f1-oracle").label == "f1-oracle (oracle)"


def test_las_queues_by_attained_service() -> None:
    jobs = [J(0, 0.0, attained_gpu_s=THRESHOLDS[0] + 1), J(1, 1.0), J(2, 2.0, attained_gpu_s=1e9)]
    assert order(make_policy("las"), jobs, Obs()) == [1, 0, 2]
    assert Las.next_threshold(0.0) == THRESHOLDS[0]
    assert Las.next_threshold(THRESHOLDS[-1]) is None


def test_random_depends_on_the_seed_only() -> None:
    jobs = [J(i, float(i)) for i in range(30)]
    a = order(make_policy("random"), jobs, Obs(), k=30, seed=1)
    assert a == order(make_policy("random"), jobs, Obs(), k=30, seed=1)
    assert a != order(make_policy("random"), jobs, Obs(), k=30, seed=2)
    assert sorted(a) == list(range(30))


def test_unknown_policy_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown policy 'sjf'"):
        make_policy("sjf")
    with pytest.raises(UserError, match=r"checkpoint model\.pt: no such file"):
        make_policy("rl:model.pt")
