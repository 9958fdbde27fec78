"""The scoring network: scores follow their jobs, not their slots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.scoring.rl.network import NetConfig, RunningMeanStd, ScoreNet


def _net(context: bool, seed: int = 0) -> ScoreNet:
    torch.manual_seed(seed)
    net = ScoreNet(NetConfig(n_job=6, n_global=3, hidden=16, context=context))
    with torch.no_grad():  # a non-zero linear term and normaliser, so every part is exercised
        net.linear.weight.normal_()
        net.job_norm.update(np.random.default_rng(seed).normal(size=(50, 6)))
    return net.eval()


@pytest.mark.parametrize("context", [True, False])
def test_scores_do_not_depend_on_window_order(context: bool) -> None:
    net = _net(context)
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(2, 20))
        x = torch.as_tensor(rng.normal(size=(1, n, 6)), dtype=torch.float32)
        g = torch.as_tensor(rng.normal(size=(1, 3)), dtype=torch.float32)
        mask = torch.ones(1, n, dtype=torch.bool)
        perm = torch.as_tensor(rng.permutation(n))
        with torch.no_grad():
            s, v = net(x, mask, g)
            s2, v2 = net(x[:, perm], mask, g)
        torch.testing.assert_close(s2[0], s[0, perm], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v2, v, rtol=1e-5, atol=1e-5)


def test_padding_changes_nothing_and_is_masked() -> None:
    net = _net(True)
    rng = np.random.default_rng(4)
    x = torch.as_tensor(rng.normal(size=(1, 5, 6)), dtype=torch.float32)
    g = torch.zeros(1, 3)
    padded = torch.cat([x, torch.as_tensor(rng.normal(size=(1, 3, 6)), dtype=torch.float32)], 1)
    mask = torch.tensor([[True] * 5 + [False] * 3])
    with torch.no_grad():
        s, v = net(x, torch.ones(1, 5, dtype=torch.bool), g)
        sp, vp = net(padded, mask, g)
    torch.testing.assert_close(sp[0, :5], s[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vp, v, rtol=1e-5, atol=1e-5)
    assert torch.isneginf(sp[0, 5:]).all()


def test_kernel_scores_each_job_alone() -> None:
    """Without context a job's score is the same whatever else is in the window."""
    net = _net(False)
    rng = np.random.default_rng(5)
    x = torch.as_tensor(rng.normal(size=(1, 4, 6)), dtype=torch.float32)
    with torch.no_grad():
        alone = torch.cat([net(x[:, i : i + 1], torch.ones(1, 1, dtype=torch.bool),
                               torch.zeros(1, 3))[0][0] for i in range(4)])  # fmt: skip
        together = net(x, torch.ones(1, 4, dtype=torch.bool), torch.zeros(1, 3))[0][0]
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def test_running_mean_std_matches_numpy() -> None:
    rng = np.random.default_rng(6)
    chunks = [rng.normal(loc=3.0, scale=2.0, size=(int(rng.integers(1, 40)), 4)) for _ in range(7)]
    rms = RunningMeanStd(4)
    for c in chunks:
        rms.update(c)
    allx = np.concatenate(chunks)
    np.testing.assert_allclose(rms.mean.numpy(), allx.mean(0), rtol=1e-6)
    np.testing.assert_allclose(rms.var.numpy(), allx.var(0), rtol=1e-3)  # 1e-4 prior count
    z = rms(torch.as_tensor(allx[:3]))
    np.testing.assert_allclose(
        z.numpy(), (allx[:3] - allx.mean(0)) / np.sqrt(allx.var(0)), rtol=1e-3
    )


def test_varies_tells_constant_columns_from_the_buffers() -> None:
    """A column folded in at one value only (in many batches) is constant; one row off
    by 0.5 among 100,000, or a column of small but real spread, varies; before any row
    every column counts as varying."""
    assert RunningMeanStd(3).varies().tolist() == [True, True, True]
    rms = RunningMeanStd(4)
    rng = np.random.default_rng(0)
    for _ in range(10):
        rows = np.empty((10_000, 4))
        rows[:, 0] = 1.0  # constant 1 (a share of one GPU)
        rows[:, 1] = 0.0  # constant 0 (attained service without preemption)
        rows[:, 2] = 1.0
        rows[:, 3] = rng.normal(0.01, 0.003, 10_000)  # small values, real spread
        rms.update(rows)
    assert rms.varies().tolist() == [False, False, False, True]
    odd = np.array([[1.0, 0.0, 0.5, 0.01]])  # column 2 off by 0.5, once
    rms.update(odd)
    assert rms.varies().tolist() == [False, False, True, True]


def test_a_column_constant_in_training_does_not_move_scores() -> None:
    """Serving a value the network never saw in a constant column (a GPU share where
    training had only whole GPUs) changes no score, in the module and the numpy
    scorer alike, while a column that varied does change them."""
    from services.scoring.rl.network import WindowScorer

    torch.manual_seed(1)
    net = ScoreNet(NetConfig(n_job=6, n_global=3, hidden=16, context=True))
    rng = np.random.default_rng(1)
    train = rng.normal(size=(5_000, 6))
    train[:, 1] = 1.0
    with torch.no_grad():
        net.linear.weight.normal_()
        net.job_norm.update(train)
        net.global_norm.update(rng.normal(size=(100, 3)))
    net.eval()
    scorer = WindowScorer(net)
    x = rng.normal(size=(7, 6)).astype(np.float32)
    x[:, 1] = 1.0
    g = rng.normal(size=3).astype(np.float32)
    mask = torch.ones(1, 7, dtype=torch.bool)

    def module(v: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            s, _ = net(torch.as_tensor(v[None]), mask, torch.as_tensor(g[None]))
        out: np.ndarray = s[0].numpy()
        return out

    shared = x.copy()
    shared[:3, 1] = np.array([0.5, 0.25, 0.1], dtype=np.float32)
    np.testing.assert_array_equal(module(shared), module(x))
    np.testing.assert_array_equal(scorer(shared, g), scorer(x, g))
    moved = x.copy()
    moved[:3, 0] += 1.0
    assert not np.allclose(module(moved), module(x))
    assert not np.allclose(scorer(moved, g), scorer(x, g))
