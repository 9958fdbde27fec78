"""Per-round credit (env.round_rewards): a hand-computed episode, and on real
episodes of the tiny environment the rounds' rewards add up to the episode's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.scoring.rl.env import (
    EpisodeConfig,
    EpisodeResult,
    EpisodeSpec,
    round_rewards,
    run_episode,
)
from services.scoring.rl.network import NetConfig, ScoreNet
from services.scoring.rl.rollout import make_batch
from shared.metrics import JobRecord, Segment
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES
from tests.services.scoring.test_rl_learns import CLUSTER, TRACE


def _rec(i: int, start: float | None) -> JobRecord:
    segs = () if start is None else (Segment(start, start + 100.0),)
    return JobRecord(f"j{i}", "vc", 0.0, 1, segments=segs)


def test_round_rewards_by_hand() -> None:
    # all submitted at 0; baseline starts 10, 20, 30 (mean queue 20); the policy's
    # rounds at 0, 5 and 40 start job 0 at 0, job 2 at 5 and job 1 at 40 (mean 15)
    base = [_rec(0, 10.0), _rec(1, 20.0), _rec(2, 30.0)]
    run = [_rec(0, 0.0), _rec(1, 40.0), _rec(2, 5.0)]
    gain = (20.0 - 15.0) / 20.0
    out = round_rewards(base, run, {0, 1, 2}, "queue", [0.0, 5.0, 40.0], gain)
    # job 0: (10/3 - 0/3)/20, job 2: (30/3 - 5/3)/20, job 1: (20/3 - 40/3)/20
    assert out == pytest.approx([10 / 60, 25 / 60, -20 / 60], abs=1e-12)
    assert out.sum() == pytest.approx(gain, abs=1e-12)
    # a job started between rounds counts for the round before; one that never
    # started under the policy, for the last round; extra reward goes to the last
    run = [_rec(0, 3.0), _rec(1, None), _rec(2, 5.0)]
    out = round_rewards(base, run, {0, 1, 2}, "queue", [0.0, 5.0, 40.0], 0.5)
    mean_p = (3.0 + 5.0) / 2
    gain = (20.0 - mean_p) / 20.0
    want = [(10 / 3 - 3 / 2) / 20, (30 / 3 - 5 / 2) / 20, (20 / 3) / 20 + (0.5 - gain)]
    assert out == pytest.approx(want, abs=1e-12)
    # the -100% floor scales the jobs' terms down to it
    run = [_rec(0, 100.0), _rec(1, 100.0), _rec(2, 100.0)]
    out = round_rewards(base, run, {0, 1, 2}, "queue", [0.0, 50.0], -1.0)
    assert out == pytest.approx([0.0, -1.0], abs=1e-12)
    # util is not a sum over jobs: all on the last round
    assert list(round_rewards(base, run, {0, 1, 2}, "util", [0.0, 5.0], 0.3)) == [0.0, 0.3]


@pytest.mark.parametrize("objective", ["bsld", "queue", "jct"])
def test_round_rewards_add_up_on_real_episodes(objective: str) -> None:
    torch.manual_seed(0)
    net = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES), hidden=8))
    cfg = EpisodeConfig(
        prefix=4, jobs=8, baseline="fifo", window=8, objective=objective, dense=True
    )
    results = [
        run_episode(TRACE, [CLUSTER], EpisodeSpec(0, 0, 1e9, seed=s), cfg, net, JOB_FEATURES)
        for s in range(12)
    ]
    assert any(abs(r.reward) > 1e-6 for r in results)  # the check is not vacuous
    for r in results:
        assert r.step_rewards is not None and len(r.step_rewards) == len(r.steps)
        assert r.step_rewards.sum() == pytest.approx(r.reward, abs=1e-9)
    batch = make_batch(results, JOB_FEATURES)
    assert batch is not None
    assert batch.rewards.sum() == pytest.approx(sum(r.reward for r in results), abs=1e-9)
    assert int(batch.ends.sum()) == sum(1 for r in results if r.steps)
    # without dense credit the reward sits on each episode's last round only
    flat = make_batch([*(_flat(r) for r in results)], JOB_FEATURES)
    assert flat is not None
    assert np.count_nonzero(flat.rewards[~flat.ends]) == 0


def _flat(r: EpisodeResult) -> EpisodeResult:
    r.step_rewards = None
    return r
