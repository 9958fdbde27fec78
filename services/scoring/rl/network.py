"""The scoring network: one small MLP shared by every job (RLScheduler's and
RLTune's "kernel"), optionally told what the rest of the window looks like.

    e_j   = embed(norm(x_j))                    per job, shared weights
    c     = mean_{j valid} e_j  ++  norm(g)     the window and the cluster
    s_j   = w . norm(x_j) + head(e_j ++ c)   (context)   or  ... + head(e_j)   (kernel)
    V     = value(c)                            a baseline that sees the whole queue

The linear term (wide-and-deep style, starting at zero) lets PPO find a plain
weighting of the features, such as shortest-estimate-first, in a few updates;
the MLP learns the rest. Scores of empty slots are -inf (masked softmax).
Every operation is per job or a masked mean over jobs, so a job's score does
not depend on where in the window it sits (tests/services/scoring/
test_rl_network.py permutes windows to check).

Observation normalisation: running mean and variance of the job and cluster
features (CleanRL's RunningMeanStd), kept as buffers so a checkpoint carries
them; the trainer updates them between PPO iterations, never inside one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["NetConfig", "RunningMeanStd", "ScoreNet"]


@dataclass(frozen=True)
class NetConfig:
    n_job: int  # job features the network reads (after the ablation's selection)
    n_global: int  # cluster features
    hidden: int = 32
    context: bool = True  # False: the plain kernel, each job scored alone

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class RunningMeanStd(nn.Module):
    """Running mean / variance over rows (parallel-variance update, Chan et al.)."""

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, dim: int, clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip = clip

    def update(self, rows: np.ndarray) -> None:
        """Fold in `rows` [n, dim]."""
        if len(rows) == 0:
            return
        x = torch.as_tensor(rows, dtype=torch.float64)
        b_mean, b_var, b_n = x.mean(0), x.var(0, unbiased=False), float(len(x))
        mean, var, n = self.mean, self.var, float(self.count)
        delta = b_mean - mean
        tot = n + b_n
        self.mean.copy_(mean + delta * b_n / tot)
        m2 = var * n + b_var * b_n + delta.pow(2) * n * b_n / tot
        self.var.copy_(m2 / tot)
        self.count.fill_(tot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean.to(x.dtype)
        std = torch.sqrt(self.var.to(x.dtype) + 1e-8)
        return torch.clamp((x - mean) / std, -self.clip, self.clip)


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out))


class ScoreNet(nn.Module):
    def __init__(self, cfg: NetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.job_norm = RunningMeanStd(cfg.n_job)
        self.global_norm = RunningMeanStd(cfg.n_global)
        self.embed = nn.Sequential(nn.Linear(cfg.n_job, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh())
        self.linear = nn.Linear(cfg.n_job, 1, bias=False)
        nn.init.zeros_(self.linear.weight)
        self.head = _mlp(h + (h + cfg.n_global if cfg.context else 0), h, 1)
        self.value_head = _mlp(h + cfg.n_global, 2 * h, 1)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, N, n_job], mask [B, N] bool, g [B, n_global] -> scores [B, N], value [B]."""
        xn = self.job_norm(x)
        e = self.embed(xn)
        m = mask.unsqueeze(-1).to(e.dtype)
        pooled = (e * m).sum(1) / m.sum(1).clamp(min=1.0)
        ctx = torch.cat([pooled, self.global_norm(g)], dim=-1)
        if self.cfg.context:
            inp = torch.cat([e, ctx.unsqueeze(1).expand(-1, e.shape[1], -1)], dim=-1)
        else:
            inp = e
        scores = (self.head(inp) + self.linear(xn)).squeeze(-1)
        scores = scores.masked_fill(~mask, float("-inf"))
        return scores, self.value_head(ctx).squeeze(-1)
