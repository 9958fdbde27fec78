"""The residual network on `drf` (`--residual drf`): untrained, it ranks exactly as the
real `drf` policy (random queues with many VCs, tied shares, same-second jobs and
queues longer than the window; and a whole simulation of real Philly jobs); its base
score against a hand-computed window; the numpy path against the module with a
non-zero correction; the checkpoint round trip; and the tie shuffle of episodes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch
from torch import nn

from bench.tie_orders import shuffled
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.scoring.policies.drf import DrfByAllocation
from services.scoring.rl.args import FEATURE_SETS, Args
from services.scoring.rl.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from services.scoring.rl.env import EpisodeConfig, EpisodeSpec, build_episode, shuffle_ties
from services.scoring.rl.network import ScoreNet, WindowScorer, drf_base
from services.scoring.rl.policy import RLPolicy
from services.scoring.rl.train import net_config
from shared.cluster import load_cluster, parse_cluster
from shared.errors import UserError
from shared.policy_api import History, PolicyContext, QueuedJob
from shared.policy_features import JOB_FEATURES, encode, encode_global
from shared.sim import SimConfig, load_jobs, simulate
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.state import ClusterState
from shared.traces import SkipStats

CLUSTER = parse_cluster({"nodes": [{"name": "p", "count": 4, "gpu_type": "P100", "gpus": 8}]})
FEATURES = FEATURE_SETS["all"]
TRACE = Path(__file__).resolve().parents[3] / "../shared/traces/philly/philly-sep-oct.csv"


def _residual(seed: int, features: tuple[str, ...] = FEATURES) -> ScoreNet:
    """An untrained residual network whose other weights and normalisers are random,
    so that only the zero output layer keeps it at the base."""
    torch.manual_seed(seed)
    net = ScoreNet(net_config(Args(residual="drf"), features))
    net.job_norm.update(np.random.default_rng(seed).normal(size=(64, len(features))))
    return net


def test_untrained_residual_is_drf_on_random_queues() -> None:
    rng = np.random.default_rng(0)
    vcs = [f"vc{i}" for i in range(24)]  # more VCs than a log wait spans ranks
    for trial in range(40):
        history = History()
        for k in range(int(rng.integers(0, 12))):
            history.record(
                QueuedJob(9000 + k, "h", 0.0, 1, vc=vcs[k]), float(rng.integers(1, 9999))
            )
        n = int(rng.integers(2, 120))
        jobs = [
            QueuedJob(i, f"j{i}", float(rng.integers(0, 50)) * 1000.0, int(rng.choice([1, 2, 4])),
                      vc=str(rng.choice(vcs[: int(rng.integers(1, 25))])))
            for i in range(n)
        ]  # fmt: skip
        jobs.sort(key=lambda j: (j.submit_s, j.seq))
        held = {vc: float(rng.integers(0, 4)) * 4 for vc in vcs}  # many tied shares
        waiting = WaitingIndex()
        for j in jobs:
            waiting.add(j)
        obs = SimObservation(ClusterState(CLUSTER), waiting, history, held)
        obs.now = 60_000.0
        k = int(rng.integers(1, n + 1))  # often fewer than wait: drf's head is the pool
        mine = RLPolicy(_residual(trial), FEATURES, max_jobs=k)
        drf = make_policy("drf")
        drf.reset(PolicyContext(CLUSTER, history))
        for j in jobs:
            mine.add(j)
            drf.add(j)
        assert [j.seq for j in mine.window(k, obs)] == [j.seq for j in drf.window(k, obs)]


def test_untrained_residual_is_drf_in_a_simulation() -> None:
    """Real Philly jobs on a training cluster that queues hundreds (so the pool is
    drf's head, not the whole queue), window 16: every job starts when and where it
    starts under drf."""
    cluster = load_cluster("clusters/train/p100.yaml")
    jobs = load_jobs(str(TRACE), "philly", cluster, SkipStats())[20_000:21_200]
    cfg = SimConfig(window=16, seed=0)
    a = simulate(jobs, cluster, RLPolicy(_residual(3), FEATURES, max_jobs=16),
                 make_placer("greedy"), cfg)  # fmt: skip
    # (drf's base is its order by allocation: the fair-share tie-break is not in it)
    b = simulate(jobs, cluster, DrfByAllocation(), make_placer("greedy"), cfg)
    assert max(r.queue_s for r in b.records) > 3600  # a loaded run
    assert [r.segments for r in a.records] == [r.segments for r in b.records]


def test_residual_on_drf_refuses_weighted_queues() -> None:
    """drf divides a VC's GPUs by its queue weight; the residual's base does not, so on a
    cluster with other weights it would not be drf: refused in one line, naming them."""
    spec = {"nodes": [{"name": "p", "gpu_type": "P100", "gpus": 8}]}
    weighted = parse_cluster({**spec, "queues": {"nlp": {"weight": 2}, "cv": {"weight": 1}}})
    with pytest.raises(UserError, match=r"weights nlp; use a policy trained without"):
        RLPolicy(_residual(0), FEATURES).reset(PolicyContext(weighted, History()))
    ones = parse_cluster({**spec, "queues": {"nlp": {"weight": 1}}})
    RLPolicy(_residual(0), FEATURES).reset(PolicyContext(ones, History()))


def test_drf_base_by_hand() -> None:
    # three VCs (ranks 0, 1/2, 1), one VC twice; waits 99 s, 9 s, 999 s, 0 s, 9 s
    rank = torch.tensor([[0.0, 0.5, 1.0, 0.0, 0.5, 0.0]])
    wait = torch.log10(1 + torch.tensor([[99.0, 9.0, 999.0, 0.0, 9.0, 0.0]]))
    mask = torch.tensor([[True, True, True, True, True, False]])
    got = drf_base(rank, wait, mask)[0, :5]
    want = torch.tensor([2.0, -10 + 1.0, -20 + 3.0, 0.0, -10 + 1.0])
    torch.testing.assert_close(got, want)
    one = drf_base(
        torch.zeros(1, 3), torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3, dtype=torch.bool)
    )
    torch.testing.assert_close(one, torch.tensor([[1.0, 2.0, 3.0]]))  # one VC: the wait


def _window(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    history = History()
    jobs = [
        QueuedJob(i, f"j{i}", float(rng.integers(0, 900)), int(rng.choice([1, 2, 4])),
                  vc=str(rng.choice(list("abcdef"))))
        for i in range(int(rng.integers(2, 60)))
    ]  # fmt: skip
    waiting = WaitingIndex()
    for j in jobs:
        waiting.add(j)
    held = {vc: float(rng.integers(0, 5)) for vc in "abcdef"}
    obs = SimObservation(ClusterState(CLUSTER), waiting, history, held)
    obs.now = 1000.0
    x, _ = encode(jobs, obs, len(jobs))
    return x, encode_global(obs)


@pytest.mark.parametrize("context, bound", [(True, 0.0), (False, 0.0), (True, 0.4)])
def test_residual_numpy_path_equals_the_module(context: bool, bound: float) -> None:
    """With a non-zero correction (the output layer perturbed) the served numpy path
    and the module agree; untrained, both give the base exactly; a bounded correction
    stays within its bound of the base."""
    args = Args(residual="drf", residual_bound=bound)
    cfg = dataclasses.replace(net_config(args, FEATURES), context=context)
    for seed in range(10):
        torch.manual_seed(seed)
        net = ScoreNet(cfg).eval()
        x, g = _window(seed)
        cols = [JOB_FEATURES.index(f) for f in FEATURES]
        xs = torch.from_numpy(x[:, cols][None])
        mask = torch.ones(1, len(x), dtype=torch.bool)
        base = drf_base(xs[..., cfg.base_rank_col], xs[..., cfg.base_wait_col], mask)[0]
        scorer = WindowScorer(net)
        with torch.no_grad():
            untrained = net(xs, mask, torch.from_numpy(g[None]))[0][0]
        assert torch.equal(untrained, base)
        np.testing.assert_array_equal(scorer(x[:, cols], g), base.numpy())
        with torch.no_grad():
            for p in net.head[2].parameters():
                p.add_(torch.randn_like(p))
            module = net(xs, mask, torch.from_numpy(g[None]))[0][0].numpy()
        assert not np.allclose(module, base.numpy())
        if bound:
            assert np.abs(module - base.numpy()).max() <= bound + 1e-5  # float32 rounding
        np.testing.assert_allclose(scorer(x[:, cols], g), module, rtol=1e-5, atol=1e-5)


def test_residual_checkpoint_round_trips(tmp_path: Path) -> None:
    net = _residual(1, FEATURE_SETS["no-history"])
    with torch.no_grad():
        cast(nn.Linear, net.head[2]).bias.fill_(0.25)
    path = tmp_path / "r.pt"
    save_checkpoint(path, Checkpoint(net, FEATURE_SETS["no-history"]))
    back = load_checkpoint(path)
    assert back.net.cfg == net.cfg and back.net.cfg.base == "drf"
    x, g = _window(4)
    cols = [JOB_FEATURES.index(f) for f in FEATURE_SETS["no-history"]]
    np.testing.assert_array_equal(
        WindowScorer(back.net)(x[:, cols], g), WindowScorer(net)(x[:, cols], g)
    )


def test_residual_needs_its_features() -> None:
    feats = tuple(f for f in FEATURES if f != "vc_share_rank")
    with pytest.raises(UserError, match="vc_share_rank"):
        net_config(Args(residual="drf"), feats)


def test_shuffle_ties_permutes_within_a_second_only() -> None:
    cluster = load_cluster("clusters/philly-hetero.yaml")
    jobs = load_jobs(str(TRACE), "philly", cluster, SkipStats())[:3000]
    a = shuffle_ties(jobs, np.random.default_rng(7))
    b = shuffle_ties(jobs, np.random.default_rng(7))
    assert a == b  # seeded
    assert sorted(map(id, a)) == sorted(map(id, jobs))  # the same jobs
    assert [j.submit_s for j in a] == sorted(j.submit_s for j in jobs)
    assert a != sorted(jobs, key=lambda j: j.submit_s)  # some second has several jobs
    assert shuffled(jobs, 7) == a  # the bench's orders are the training's


def test_episodes_shuffle_ties_when_asked() -> None:
    """`--shuffle-ties`: an episode holds the same jobs, those of one second in another
    order, drawn from the episode's seed."""
    cluster = load_cluster("clusters/train/p100.yaml")
    trace = load_jobs(str(TRACE), "philly", cluster, SkipStats())[:20_000]
    spec = EpisodeSpec(0, 5_000, 1.0, 11)
    plain, n = build_episode(trace, cluster, spec, EpisodeConfig())
    mixed, m = build_episode(trace, cluster, spec, EpisodeConfig(shuffle_ties=True))
    assert n == m and sorted(map(id, plain)) == sorted(map(id, mixed)) and plain != mixed
    assert [j.submit_s for j in mixed] == [j.submit_s for j in plain]
