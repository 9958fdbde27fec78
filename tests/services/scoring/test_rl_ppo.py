"""PPO's pieces against values computed by hand (or by enumeration)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from services.scoring.rl.ppo import (
    clipped_policy_loss,
    gae,
    masked_entropy,
    pl_log_prob,
    sample_ranking,
    value_loss,
)

INF = float("inf")


def test_clipped_loss_by_hand() -> None:
    # ratios e^0.5 = 1.6487 (clipped to 1.2 for A > 0), e^-0.5 = 0.6065 (A < 0: clip to 0.8)
    new = torch.tensor([0.5, -0.5, 0.5, 0.1])
    old = torch.zeros(4)
    adv = torch.tensor([1.0, -2.0, -1.0, 3.0])
    # per sample max(-A r, -A clip(r)):
    #   A=1,  r=1.6487: max(-1.6487, -1.2)     = -1.2
    #   A=-2, r=0.6065: max(1.2131, 1.6)       = 1.6
    #   A=-1, r=1.6487: max(1.6487, 1.2)       = 1.6487
    #   A=3,  r=1.1052: max(-3.3155, -3.3155)  = -3.3155
    want = (-1.2 + 1.6 + math.exp(0.5) - 3 * math.exp(0.1)) / 4
    got = clipped_policy_loss(new, old, adv, clip=0.2).item()
    assert got == pytest.approx(want, rel=1e-6)


def test_value_loss_by_hand() -> None:
    new, old, ret = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0]), torch.tensor([3.0, 1.0])
    assert value_loss(new, old, ret, None).item() == pytest.approx(0.5 * (1 + 1) / 2)
    # clipped: v = 1 + clip(1, -.2, .2) = 1.2 -> (1.2-3)^2 = 3.24 > 1: max is 3.24; 2nd: 1
    assert value_loss(new, old, ret, 0.2).item() == pytest.approx(0.5 * (3.24 + 1) / 2)


def test_gae_by_hand() -> None:
    # two episodes: [r=0, r=1] and [r=2]; gamma .9, lambda .8
    r = np.array([0.0, 1.0, 2.0])
    v = np.array([0.5, 0.4, 1.0])
    ends = np.array([False, True, True])
    adv, ret = gae(r, v, ends, gamma=0.9, lam=0.8)
    d1 = 1.0 - 0.4  # last step of episode 1: nothing bootstrapped
    d0 = 0.0 + 0.9 * 0.4 - 0.5
    a0 = d0 + 0.9 * 0.8 * d1
    np.testing.assert_allclose(adv, [a0, d1, 2.0 - 1.0])
    np.testing.assert_allclose(ret, adv + v)
    with pytest.raises(ValueError):
        gae(r, v, np.array([False, True, False]), 0.9, 0.8)


def test_gae_lambda_one_is_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=6), rng.normal(size=6)
    ends = np.array([False, False, True, False, False, True])
    _, ret = gae(r, v, ends, gamma=1.0, lam=1.0)
    want = [r[0:3].sum(), r[1:3].sum(), r[2], r[3:6].sum(), r[4:6].sum(), r[5]]
    np.testing.assert_allclose(ret, want)


def test_entropy_by_hand() -> None:
    scores = torch.tensor([[0.0, 0.0, 0.0, -INF], [math.log(3.0), 0.0, -INF, -INF]])
    mask = torch.isfinite(scores)
    h = masked_entropy(scores, mask)
    p = np.array([0.75, 0.25])
    assert h[0].item() == pytest.approx(math.log(3.0), rel=1e-6)
    assert h[1].item() == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-6)


def _pl_enumerated(s: list[float], prefix: tuple[int, ...]) -> float:
    """log P(ranking starts with `prefix`), summing Plackett-Luce over full rankings."""
    w = np.exp(s)
    total = 0.0
    for perm in itertools.permutations(range(len(s))):
        if perm[: len(prefix)] != prefix:
            continue
        p, left = 1.0, w.sum()
        for i in perm:
            p *= w[i] / left
            left -= w[i]
        total += p
    return math.log(total)


def test_pl_log_prob_matches_enumeration() -> None:
    s = [0.3, -1.0, 2.0, 0.5]
    scores = torch.tensor([[*s, -INF]] * 3)
    perm = torch.tensor([[2, 0, 3, 1, 4], [1, 3, 0, 2, 4], [3, 2, 1, 0, 4]])
    pulled = torch.tensor([2, 4, 1])
    got = pl_log_prob(scores, perm, pulled)
    for b in range(3):
        prefix = tuple(int(i) for i in perm[b, : int(pulled[b])])
        assert got[b].item() == pytest.approx(_pl_enumerated(s, prefix), abs=1e-5)
    # the first pick alone is the softmax
    assert got[2].item() == pytest.approx(0.5 - math.log(sum(math.exp(x) for x in s)), abs=1e-6)


def test_pl_gradient_is_finite_with_empty_slots() -> None:
    scores = torch.tensor([[1.0, 2.0, -INF, -INF]], requires_grad=True)
    masked = scores.masked_fill(~torch.isfinite(scores.detach()), -INF)
    lp = pl_log_prob(masked, torch.tensor([[1, 0, 2, 3]]), torch.tensor([2]))
    lp.sum().backward()
    assert scores.grad is not None and torch.isfinite(scores.grad).all()
    assert lp.item() == pytest.approx(2.0 - math.log(math.exp(1) + math.exp(2)), abs=1e-6)


def test_sample_ranking_first_pick_follows_softmax() -> None:
    scores = np.array([1.0, 0.0, -1.0, 0.5, 9.0], dtype=np.float32)
    rng = np.random.default_rng(7)
    n = 5_000
    firsts = np.bincount([sample_ranking(scores, 4, rng)[0] for _ in range(n)], minlength=5)
    p = np.exp(scores[:4]) / np.exp(scores[:4]).sum()
    assert firsts[4] == 0  # slot 4 is past n_valid: never drawn
    np.testing.assert_allclose(firsts[:4] / n, p, atol=0.03)
    perm = sample_ranking(scores, 4, np.random.default_rng(1))
    assert sorted(perm[:4].tolist()) == [0, 1, 2, 3] and perm[4] == 4
