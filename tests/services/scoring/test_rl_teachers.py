"""The warm start's teacher rankings, computed from the encoded features (and, for
the privileged teachers, the true run times the trainer holds), are the orders
the real heuristic policies give (services.scoring.policies), on many random
queues."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from services.scoring.policies import make_policy
from services.scoring.rl.rollout import teacher_ranking
from shared.cluster import parse_cluster
from shared.policy_api import History, OracleContext, PolicyContext, QueuedJob
from shared.policy_features import JOB_FEATURES, encode
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.state import ClusterState

CLUSTER = parse_cluster({"nodes": [{"name": "p", "count": 4, "gpu_type": "P100", "gpus": 8}]})


@pytest.mark.parametrize("name", ["drf", "sjf-est"])
def test_teacher_is_the_heuristic(name: str) -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        history = History()
        for k in range(int(rng.integers(0, 12))):
            who, gpus = str(rng.choice(["a", "b", "c", "d"])), int(rng.choice([1, 2, 4]))
            history.record(QueuedJob(900 + k, "h", 0.0, gpus, vc=who), float(rng.integers(1, 9999)))
        jobs = _random_jobs(rng)
        held = {vc: float(rng.integers(0, 3)) * 4 for vc in "abcd"}
        waiting = WaitingIndex()
        for j in jobs:
            waiting.add(j)
        obs = SimObservation(ClusterState(CLUSTER), waiting, history, held)
        obs.now = 1000.0
        x, _ = encode(jobs, obs, len(jobs))
        mine = [jobs[i].seq for i in teacher_ranking(name, x)]
        policy = make_policy(name)
        policy.reset(PolicyContext(CLUSTER, history))
        for j in jobs:
            policy.add(j)
        assert mine == [j.seq for j in policy.window(len(jobs), obs)]


def _random_jobs(rng: np.random.Generator) -> list[QueuedJob]:
    """2-39 jobs of 1, 2 or 4 GPUs in four VCs, in the pool's order (RLPolicy.candidates)."""
    jobs = [
        QueuedJob(i, f"j{i}", float(rng.integers(0, 900)), int(rng.choice([1, 2, 4])),
                  vc=str(rng.choice(["a", "b", "c", "d"])))
        for i in range(int(rng.integers(2, 40)))
    ]  # fmt: skip
    jobs.sort(key=lambda j: (j.submit_s, j.seq))
    return jobs


def _random_queue(rng: np.random.Generator) -> tuple[list[QueuedJob], dict[int, float], dict]:
    jobs = _random_jobs(rng)
    run = {
        j.seq: float(rng.choice([10.0, 60.0, 3600.0, float(rng.integers(1, 9999))])) for j in jobs
    }
    held = {vc: float(rng.integers(0, 3)) * 4 for vc in "abcd"}
    return jobs, run, held


def _lookup(run: dict[int, float]) -> Callable[[QueuedJob], float]:
    return lambda j: run[j.seq]


def test_oracle_teacher_is_sjf_oracle() -> None:
    """The privileged teacher's ranking is the real `sjf-oracle` policy's window
    (run times with many ties, so the submit-order tie-break is exercised too)."""
    rng = np.random.default_rng(1)
    for _ in range(30):
        jobs, run, held = _random_queue(rng)
        waiting = WaitingIndex()
        for j in jobs:
            waiting.add(j)
        obs = SimObservation(ClusterState(CLUSTER), waiting, History(), held)
        obs.now = 1000.0
        x, _ = encode(jobs, obs, len(jobs))
        truth = np.asarray([run[j.seq] for j in jobs])
        mine = [jobs[i].seq for i in teacher_ranking("sjf-oracle", x, truth)]
        policy = make_policy("sjf-oracle")
        policy.reset(OracleContext(CLUSTER, History(), 0, true_run_s=_lookup(run)))
        for j in jobs:
            policy.add(j)
        assert mine == [j.seq for j in policy.window(len(jobs), obs)]
        # drf-oracle: a reference in one line, the VC holding the fewest GPUs first
        ref = sorted(jobs, key=lambda j: (held[j.vc], run[j.seq], j.submit_s, j.seq))
        assert [jobs[i].seq for i in teacher_ranking("drf-oracle", x, truth)] == [
            j.seq for j in ref
        ]


def test_oracle_teacher_needs_run_times() -> None:
    x = np.zeros((3, len(JOB_FEATURES)), dtype=np.float32)
    with pytest.raises(ValueError, match="true run times"):
        teacher_ranking("sjf-oracle", x)


def _episode_steps(teacher: str) -> list:
    """The recorded rounds of one real ThetaGPU episode with `teacher` riding along."""
    from pathlib import Path

    from services.scoring.rl.args import FEATURE_SETS
    from services.scoring.rl.env import EpisodeConfig, EpisodeSpec, run_episode
    from services.scoring.rl.network import NetConfig, ScoreNet
    from shared.cluster import load_cluster
    from shared.policy_features import GLOBAL_FEATURES
    from shared.sim import load_jobs
    from shared.traces import SkipStats
    from tests.paths import THETAGPU

    cluster = load_cluster(Path(__file__).resolve().parents[3] / "clusters" / "thetagpu.yaml")
    jobs = load_jobs(THETAGPU, "alcf", cluster, SkipStats())[:1500]
    feats = FEATURE_SETS["identity"]
    net = ScoreNet(NetConfig(len(feats), len(GLOBAL_FEATURES)))
    cfg = EpisodeConfig(prefix=64, jobs=96, load_lo=1.2, load_hi=1.2, teacher=teacher)
    res = run_episode(jobs, [cluster], EpisodeSpec(0, 0, 1.2, 3), cfg, net, feats)
    assert len(res.steps) > 10
    return res.steps


def test_a_heuristic_riding_along_ranks_each_round_as_its_own_order() -> None:
    """fifo ranks a pool (held in (submit, seq) order) as it stands; smallest by GPUs
    then age: both computed here from the recorded features alone."""
    for step in _episode_steps("fifo"):
        assert step.teacher.tolist() == list(range(len(step.pool)))
    gpus = JOB_FEATURES.index("log2_gpus")
    for step in _episode_steps("smallest"):
        want = np.lexsort((np.arange(len(step.pool)), step.x[:, gpus]))
        assert step.teacher.tolist() == want.tolist()
