"""Helpers for tests that rank one window: an observation of waiting jobs at a time,
and an untrained residual network whose weights and normalisers are random except
its zero output layer (so that only that layer keeps it at its base heuristic)."""

from __future__ import annotations

import numpy as np
import torch

from services.scoring.rl.args import Args
from services.scoring.rl.network import ScoreNet
from services.scoring.rl.train import feature_list, net_config
from shared.cluster import ClusterSpec
from shared.policy_api import History, Policy, PolicyContext, QueuedJob
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.state import ClusterState


def window_obs(
    cluster: ClusterSpec, jobs: list[QueuedJob], history: History, now: float
) -> SimObservation:
    """`jobs` waiting on an idle `cluster` at `now`, with `history`'s finished jobs."""
    waiting = WaitingIndex()
    for j in jobs:
        waiting.add(j)
    obs = SimObservation(ClusterState(cluster), waiting, history, {})
    obs.now = now
    return obs


def untrained_residual(args: Args, seed: int) -> ScoreNet:
    """The network `args` asks for, untrained, every other weight and normaliser random."""
    torch.manual_seed(seed)
    net = ScoreNet(net_config(args, feature_list(args)))
    rows = np.random.default_rng(seed).normal(size=(64, net.cfg.n_job)) * 100.0
    net.job_norm.update(rows)
    return net


def assert_same_windows(
    mine: Policy,
    ref: Policy,
    ctx: PolicyContext,
    jobs: list[QueuedJob],
    obs: SimObservation,
    rng: np.random.Generator,
    max_jobs: int,
    label: object = None,
) -> None:
    """Give both policies `ctx` and `jobs`, then three times: the first k (random, at
    most `max_jobs`) of `mine`'s window are `ref`'s, and some of them leave both."""
    for p in (mine, ref):
        p.reset(ctx)
        for j in jobs:
            p.add(j)
    by_seq = {j.seq: j for j in jobs}
    for _ in range(3):
        k = int(rng.integers(1, max_jobs + 1))
        want = [j.seq for j in ref.window(k, obs)]
        assert [j.seq for j in mine.window(k, obs)] == want, label
        for seq in want[: int(rng.integers(0, len(want) + 1))]:
            mine.remove(by_seq[seq])
            ref.remove(by_seq[seq])
        if not want:
            break
