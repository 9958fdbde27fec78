"""The residual network on `f1` (`--residual f1`): untrained (every other weight and
normaliser random), it ranks every window exactly as the `F1` policy module does, on
random queues of users with and without requests and history, queues longer than the
window, and jobs submitted in one second; its base score against keys worked out by
hand; the numpy path against the module with a non-zero correction; the raw columns
it reads are not the network's inputs; the encoder's f1 columns against the f1
module's own estimate; and the trainer's iteration 0 (the pure base) kept as the
checkpoint when training does not beat it."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch
from torch import nn

from services.scoring.policies import make_policy
from services.scoring.policies.f1 import request_or_estimate
from services.scoring.rl.args import FEATURE_SETS, Args
from services.scoring.rl.checkpoint import load_checkpoint
from services.scoring.rl.network import ScoreNet, WindowScorer, f1_base, f1_base_np
from services.scoring.rl.policy import RLPolicy
from services.scoring.rl.train import feature_list, net_config
from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.policy_api import History, PolicyContext, QueuedJob
from shared.policy_features import JOB_FEATURES, encode, encode_global, f1_keys
from shared.sim.observe import SimObservation
from tests.policy_windows import assert_same_windows, untrained_residual, window_obs

CLUSTER = parse_cluster({"nodes": [{"name": "d", "count": 4, "gpu_type": "A100", "gpus": 8}]})
ARGS = Args(residual="f1", features="identity", residual_bound=2.0)
FEATURES = feature_list(ARGS)


def _residual(seed: int, args: Args = ARGS) -> ScoreNet:
    return untrained_residual(args, seed)


def _queue(rng: np.random.Generator, n: int) -> tuple[list[QueuedJob], History]:
    """`n` jobs of a few users (some with a request, some with history, some neither),
    many submitted in one second; and the history of finished jobs."""
    users = [f"u{i}" for i in range(int(rng.integers(1, 12)))] + [""]
    history = History()
    for k in range(int(rng.integers(0, 40))):
        u = str(rng.choice(users))
        done = QueuedJob(
            10_000 + k, "h", 0.0, int(rng.choice([1, 2, 8])), user=u, vc=f"vc{k % 3}",
            time_limit_s=float(rng.choice([600.0, 7200.0])) if rng.random() < 0.5 else None,
        )  # fmt: skip
        history.record(done, float(rng.integers(1, 20_000)))
    jobs = []
    t = float(rng.integers(0, 10**6))
    for i in range(n):
        if rng.random() < 0.6:  # else: the same second as the last job
            t += float(rng.exponential(600.0))
        jobs.append(
            QueuedJob(
                i, f"j{i}", t, int(rng.choice([1, 1, 2, 4, 8, 16, 32])),
                user=str(rng.choice(users)), vc=f"vc{i % 3}",
                time_limit_s=float(rng.integers(60, 86_400)) if rng.random() < 0.5 else None,
            )
        )  # fmt: skip
    return jobs, history


def _obs(jobs: list[QueuedJob], history: History, now: float) -> SimObservation:
    return window_obs(CLUSTER, jobs, history, now)


def test_untrained_residual_orders_every_window_as_the_f1_module() -> None:
    rng = np.random.default_rng(0)
    for trial in range(60):
        n = int(rng.integers(2, 200))
        jobs, history = _queue(rng, n)
        obs = _obs(jobs, history, jobs[-1].submit_s + float(rng.integers(0, 10**5)))
        max_jobs = int(rng.choice([8, 32, 128]))  # often fewer than wait: f1's head
        mine = RLPolicy(_residual(trial), FEATURES, max_jobs=max_jobs)
        ctx = PolicyContext(CLUSTER, history)  # and after some jobs leave:
        assert_same_windows(mine, make_policy("f1"), ctx, jobs, obs, rng, max_jobs, trial)


def test_f1_base_by_hand() -> None:
    # keys (head + rest) 874, 873, 8, 1740 and a padded slot: -scale (key - 8)
    key = torch.tensor([[874.0, 872.5, 8.0, 1740.0, 0.0]])
    rest = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    got = f1_base(key, rest, mask, scale=0.5)[0, :4]
    torch.testing.assert_close(got, -0.5 * torch.tensor([866.0, 865.0, 0.0, 1732.0]))
    np.testing.assert_array_equal(
        f1_base_np(key[0, :4].numpy(), rest[0, :4].numpy(), 0.5), got.numpy()
    )


def test_f1_key_columns_by_hand() -> None:
    """f1's key, log10(r) n + 870 log10(s), for jobs worked out by hand (origin 1000):
    u asks 600 s, no history: r = 600, 2 GPUs, s = 1000 - 1000 + 1 = 1:
        log10(600) x 2 + 0 = 5.5563025;
    v has finished 100 s and 300 s (its last two: 200), asks 150: capped, r = 150,
        1 GPU, submitted at 10,999: s = 10,000: log10(150) + 870 x 4 = 3482.1760913;
    w, nothing known: one hour, 4 GPUs, s = 100: log10(3600) x 4 + 1740 = 1754.2252;
    and the two columns add up to the float64 key."""
    h = History()
    for i, run in enumerate((100.0, 300.0)):
        h.record(QueuedJob(90 + i, "h", 0.0, 1, user="v"), run)
    jobs = [
        QueuedJob(0, "a", 1000.0, 2, user="u", time_limit_s=600.0),
        QueuedJob(1, "b", 10_999.0, 1, user="v", time_limit_s=150.0),
        QueuedJob(2, "c", 1099.0, 4, user="w"),
    ]
    got = f1_keys(jobs, h, 1000.0)
    want = [2 * math.log10(600.0), math.log10(150.0) + 3480.0, 4 * math.log10(3600) + 1740.0]
    np.testing.assert_allclose(got.sum(1), want, rtol=1e-12)
    np.testing.assert_allclose(want, [5.5563025, 3482.1760913, 1754.2252], atol=1e-6)
    assert (got[:, 0] == got[:, 0].astype(np.float32)).all()  # the head is a float32


def _window(seed: int) -> tuple[np.ndarray, np.ndarray, list[QueuedJob], SimObservation]:
    rng = np.random.default_rng(seed)
    jobs, history = _queue(rng, int(rng.integers(2, 60)))
    obs = _obs(jobs, history, jobs[-1].submit_s + 100.0)
    x, _ = encode(jobs, obs, len(jobs), origin_s=jobs[0].submit_s - 50.0)
    return x, encode_global(obs), jobs, obs


def test_encoder_carries_the_f1_modules_key() -> None:
    """The encoder's two columns against the key from the f1 module's own estimate
    (`request_or_estimate`, a separate computation), to float64 rounding."""
    for seed in range(10):
        x, _, jobs, obs = _window(seed)
        head = x[:, JOB_FEATURES.index("f1_key")].astype(np.float64)
        rest = x[:, JOB_FEATURES.index("f1_key_rest")].astype(np.float64)
        origin = jobs[0].submit_s - 50.0
        want = [
            math.log10(max(request_or_estimate(j, obs), 1.0)) * j.num_gpus
            + 870.0 * math.log10(j.submit_s - origin + 1.0)
            for j in jobs
        ]
        np.testing.assert_allclose(head + rest, want, rtol=1e-13)
    # without an origin (every policy but a residual on f1) both are 0
    _, _, jobs, obs = _window(0)
    x, _ = encode(jobs, obs, len(jobs))
    assert not x[:, [JOB_FEATURES.index(f) for f in ("f1_key", "f1_key_rest")]].any()


@pytest.mark.parametrize("context, bound", [(True, 0.0), (True, 2.0), (False, 1.0)])
def test_residual_f1_numpy_path_equals_the_module(context: bool, bound: float) -> None:
    """With the output layer perturbed, the served numpy path and the module agree; a
    bounded correction stays within its bound of the base."""
    args = dataclasses.replace(ARGS, residual_bound=bound, context=context)
    cols = [JOB_FEATURES.index(f) for f in FEATURES]
    for seed in range(8):
        net = _residual(seed, args).eval()
        x, g, _, _ = _window(seed)
        xs = x[:, cols]
        mask = torch.ones((1, len(xs)), dtype=torch.bool)
        with torch.no_grad():
            base, _ = net(torch.from_numpy(xs)[None], mask, torch.from_numpy(g)[None])
            np.testing.assert_allclose(WindowScorer(net)(xs, g), base[0].numpy(), atol=1e-3)
            out = cast(nn.Linear, net.head[2])
            out.weight.normal_(0.0, 3.0)
            out.bias.fill_(0.7)
            mod, _ = net(torch.from_numpy(xs)[None], mask, torch.from_numpy(g)[None])
        got = WindowScorer(net)(xs, g)
        np.testing.assert_allclose(got, mod[0].numpy(), rtol=1e-5, atol=1e-3)
        assert not np.allclose(mod.numpy(), base.numpy())  # the correction is not zero
        if bound:
            assert float((mod - base).abs().max()) <= bound + 1e-3


def test_the_network_does_not_read_the_raw_f1_columns() -> None:
    """Its correction is the same whatever f1's raw estimate and submit offset are (they
    are the base's alone: unbounded and relative to the episode's start)."""
    torch.manual_seed(1)
    net = ScoreNet(net_config(ARGS, FEATURES)).eval()  # normalised as it comes (prior)
    with torch.no_grad():  # the output layer and the linear term over every input
        cast(nn.Linear, net.head[2]).weight.normal_(0.0, 1.0)
        net.linear.weight.normal_(0.0, 1.0)
    x, g, _, _ = _window(3)
    xs = x[:, [JOB_FEATURES.index(f) for f in FEATURES]]
    scorer = WindowScorer(net)
    key, rest = net.cfg.base_key_col, net.cfg.base_rest_col

    def correction(v: np.ndarray) -> np.ndarray:
        out: np.ndarray = scorer(v, g) - f1_base_np(v[:, key], v[:, rest])
        return out

    moved = xs.copy()
    moved[:, key] = moved[:, key] * 37.0 + 1e4
    moved[:, rest] = 0.25
    np.testing.assert_allclose(correction(moved), correction(xs), atol=1e-4)
    assert np.ptp(correction(xs)) > 0.1  # there is a correction to compare


def test_f1_residual_adds_its_key_columns_to_any_feature_set() -> None:
    for name, features in FEATURE_SETS.items():
        args = dataclasses.replace(ARGS, features=name)
        assert feature_list(args) == (*features, "f1_key", "f1_key_rest")
        assert not {"f1_key", "f1_key_rest"} & set(features)  # only where asked for
    with pytest.raises(UserError, match="needs the feature f1_key"):
        net_config(ARGS, ("log_wait_s",))


def test_trainer_keeps_iteration_0_the_pure_base(tmp_path: Path) -> None:
    """`rltune train --residual f1` scores the untrained residual (f1 itself) as
    iteration 0 and keeps it as the checkpoint unless a later one validates higher
    (here two iterations at a learning rate that wrecks the network)."""
    from rltune import main
    from tests.rltune.test_train import _train

    argv = _train(
        tmp_path, "r.pt", "--iterations", "2", "--residual", "f1", "--warm-iterations", "0",
        "--learning-rate", "1.0", "--val-episodes", "2",
    )  # fmt: skip
    assert main(argv) == 0
    out = tmp_path / "r.pt"
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    gains = {int(r["iteration"]): float(r["charts/val_gain"]) for r in rows}
    assert sorted(gains) == [0, 1, 2]
    ckpt = load_checkpoint(str(out))
    best = max(gains.values())
    assert ckpt.meta["iteration"] == min(i for i, v in gains.items() if v == best)
    assert ckpt.meta["features_set"] == "all"
    assert ckpt.features[-2:] == ("f1_key", "f1_key_rest")
    assert gains[0] <= 0.0  # f1 is one of the heuristics it is measured against
    if ckpt.meta["iteration"] == 0:  # the base kept: its output layer is still zero
        assert not cast(nn.Linear, ckpt.net.head[2]).weight.abs().sum()
    last = load_checkpoint(str(tmp_path / "r.last.pt"))
    assert cast(nn.Linear, last.net.head[2]).weight.abs().sum() > 0  # it did train


def test_geometric_validation_score_by_hand() -> None:
    """1 - the geometric mean of policy / best (best / policy for utilisation): twice
    as bad on one episode and twice as good on another is level (0); four times as
    bad on one of two is 1 - 2 = -1; episodes without a finite positive objective are
    left out."""
    from services.scoring.rl.train import val_score_geo

    assert val_score_geo("bsld", [(2.0, 1.0), (1.0, 2.0)]) == pytest.approx(0.0)
    assert val_score_geo("bsld", [(4.0, 1.0), (1.0, 1.0), (math.inf, 1.0)]) == pytest.approx(-1.0)
    assert val_score_geo("util", [(0.5, 1.0)]) == pytest.approx(-1.0)
    assert val_score_geo("bsld", [(0.0, 1.0)]) == 0.0
