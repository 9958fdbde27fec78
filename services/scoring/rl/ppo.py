"""PPO's pieces for a ranking policy, each a pure function tested against
hand-computed values (tests/services/scoring/test_rl_ppo.py).

One decision = one scheduling round: the window is ranked by Plackett-Luce
(sampling without replacement from the masked softmax of the scores, the
Gumbel-top-k trick), and the log-probability of that decision is the sum over
the ranks the simulator actually read (`pulled`): the jobs past them changed
nothing, so they do not enter the gradient.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "clipped_policy_loss",
    "gae",
    "masked_entropy",
    "pl_log_prob",
    "sample_ranking",
    "value_loss",
]

_NEG = -1e9  # stands for -inf where gradients must stay finite


def sample_ranking(scores: np.ndarray, n_valid: int, rng: np.random.Generator) -> np.ndarray:
    """A Plackett-Luce ranking of the first `n_valid` slots (Gumbel top-k), then the rest."""
    noisy = scores[:n_valid] + rng.gumbel(size=n_valid)
    head = np.argsort(-noisy, kind="stable")
    return np.concatenate([head, np.arange(n_valid, len(scores))]).astype(np.int64)


def pl_log_prob(scores: torch.Tensor, perm: torch.Tensor, pulled: torch.Tensor) -> torch.Tensor:
    """log P(perm[:pulled]) under Plackett-Luce with `scores` [B, N] (-inf = empty slot).

    log P = sum_{i < pulled} ( s[perm_i] - logsumexp_{j >= i} s[perm_j] ).
    perm [B, N] puts every empty slot after the valid ones; pulled [B].
    """
    s = scores.gather(1, perm)
    s = s.masked_fill(~torch.isfinite(s), _NEG)
    suffix = torch.flip(torch.logcumsumexp(torch.flip(s, [1]), dim=1), [1])
    terms = s - suffix
    ranks = torch.arange(s.shape[1], device=s.device).unsqueeze(0)
    return terms.masked_fill(ranks >= pulled.unsqueeze(1), 0.0).sum(1)


def masked_entropy(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Entropy of the first pick: the softmax over the valid slots [B]."""
    logp = torch.log_softmax(scores.masked_fill(~mask, _NEG), dim=-1)
    return -(logp.exp() * logp).masked_fill(~mask, 0.0).sum(-1)


def clipped_policy_loss(
    new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float
) -> torch.Tensor:
    """PPO's clipped surrogate, as a loss: mean of max(-A r, -A clip(r, 1-c, 1+c))."""
    ratio = torch.exp(new_logp - old_logp)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    return torch.max(pg1, pg2).mean()


def value_loss(
    new_v: torch.Tensor,
    old_v: torch.Tensor,
    returns: torch.Tensor,
    clip: float | None,
) -> torch.Tensor:
    """0.5 x mean squared error; with `clip`, CleanRL's clipped value loss."""
    unclipped = (new_v - returns) ** 2
    if clip is None:
        return 0.5 * unclipped.mean()
    clipped = old_v + torch.clamp(new_v - old_v, -clip, clip)
    return 0.5 * torch.max(unclipped, (clipped - returns) ** 2).mean()


def gae(
    rewards: np.ndarray, values: np.ndarray, ends: np.ndarray, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) by generalised advantage estimation.

    Steps are stored episode after episode; `ends[t]` marks the last step of an
    episode (nothing is bootstrapped past it). The last step must end one.
    """
    n = len(rewards)
    if n and not ends[-1]:
        raise ValueError("the last step must end an episode")
    adv = np.zeros(n, dtype=np.float64)
    last = 0.0
    for t in reversed(range(n)):
        nonterminal = 0.0 if ends[t] else 1.0
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
    return adv, adv + values
