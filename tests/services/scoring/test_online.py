"""Online learning from rewards (`scoring --learn`): real PPO updates on the network
the policy ranks with, moving its rankings toward what the rewards pay for."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from services.scoring.online import OnlineLearner
from services.scoring.queue import ScoringState
from services.scoring.rl.args import Args
from services.scoring.rl.network import NetConfig, ScoreNet
from services.scoring.rl.policy import RLPolicy
from services.scoring.service import ScoringHandler, ScoringSettings
from shared.bus import Record, ServiceStats
from shared.config import BusSettings
from shared.messages import Job, NodeStatus, Reward, encode
from shared.policy_features import F1_FEATURES, FAIR_SHARE_FEATURES, GLOBAL_FEATURES, JOB_FEATURES

# the columns the network was first drawn over (an added optional column would change
# the seeded draw of its weights)
FEATURES = tuple(f for f in JOB_FEATURES if f not in FAIR_SHARE_FEATURES + F1_FEATURES)


def _setup() -> tuple[ScoringState, OnlineLearner, RLPolicy]:
    torch.manual_seed(0)
    net = ScoreNet(NetConfig(len(FEATURES), len(GLOBAL_FEATURES), hidden=16))
    policy = RLPolicy(net, FEATURES)
    state = ScoringState(policy, None, seed=0)
    state.node(NodeStatus("h", "V100", 64, list(range(64))))
    for i in range(8):  # four 1-GPU jobs and four 8-GPU jobs, interleaved by age
        state.accepted(Job(f"j{i}", 1 if i % 2 else 8, float(i), user=f"u{i % 2}"), True)
    args = replace(Args(), learning_rate=1e-2, update_epochs=4, minibatch_steps=64)
    return state, OnlineLearner(policy, episodes=4, seed=0, args=args), policy


def _p_small_first(state: ScoringState, policy: RLPolicy) -> float:
    """P(the first pick is a 1-GPU job) under the policy's Plackett-Luce, computed
    here from its scores (softmax over the window)."""
    from shared.policy_features import encode, encode_global
    from shared.sim.observe import SimObservation

    obs = SimObservation(state.view.state, state.waiting, state.history, state.vc_held)
    pool = policy.candidates()
    x, _ = encode(pool, obs, len(pool))
    s = policy.scores(x, encode_global(obs)).astype(np.float64)
    p = np.exp(s - s.max())
    p /= p.sum()
    return float(sum(pi for pi, j in zip(p, pool, strict=True) if j.num_gpus == 1))


def test_rewards_train_the_policy_toward_what_they_pay_for() -> None:
    state, learner, policy = _setup()
    before = {k: v.clone() for k, v in policy.net.state_dict().items()}
    p0 = _p_small_first(state, policy)
    losses = []
    for rid in range(160):
        batch = state.free_round(rid, 100.0)
        assert batch is not None
        first = batch.jobs[0][0]
        state.placed([], rid)  # nothing placed: the same eight jobs wait again
        got = learner.reward(1.0 if int(first[1:]) % 2 else -1.0)  # pays for a small job first
        if got is not None:
            losses.append(got)
    assert learner.updates == 40 and len(losses) == 40
    assert all(np.isfinite(v) for d in losses for v in d.values())
    after = policy.net.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # weights moved
    p1 = _p_small_first(state, policy)
    assert p1 > p0 + 0.2, (p0, p1)


def test_no_rounds_no_episode() -> None:
    _, learner, _ = _setup()
    assert learner.reward(1.0) is None and learner.done == []  # nothing ranked yet
    assert learner.reward(float("nan")) is None


def test_the_service_learns_only_when_asked() -> None:
    """Off by default (the policy ranks by argmax, records nothing); with --learn the
    rewards read from rl.rewards reach the learner and an update is counted."""
    bus = BusSettings("unused:9092", "t.")
    off = ScoringHandler(bus, ServiceStats(), ScoringSettings(policy="rl"))
    assert off.learner is None and off.state.policy.sample is False  # type: ignore[attr-defined]
    stats = ServiceStats()
    conf = ScoringSettings(policy="rl", rounds="free", learn=True, learn_episodes=2)
    on = ScoringHandler(bus, stats, conf)
    assert on.state.policy.sample is True  # type: ignore[attr-defined]
    t = bus.topics

    def rec(topic: str, value: bytes) -> Record:
        return Record(topic, 0, 0, b"k", value)

    on(rec(t.cluster_nodes, encode(NodeStatus("h", "V100", 8, list(range(8))))))
    for i in range(4):
        on(rec(t.jobs_accepted, encode(Job(f"j{i}", 1 + i % 2, float(i)))))
    before = {k: v.clone() for k, v in on.state.policy.net.state_dict().items()}  # type: ignore[attr-defined]
    for rid in range(2):
        assert on.state.free_round(rid, 10.0) is not None
        on(rec(t.rl_rewards, encode(Reward("last:60s", 1.0 - 2 * rid))))
    assert stats.extra["rewards_seen"] == 2 and stats.extra["online_updates"] == 1
    after = on.state.policy.net.state_dict()  # type: ignore[attr-defined]
    assert any(not torch.equal(before[k], after[k]) for k in before)
