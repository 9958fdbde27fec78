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

The residual variant (`NetConfig.base = "drf"`, residual policy learning): the
score is a fixed heuristic's score plus the network's, read off the raw
(unnormalised) features,

    b_j   = -GAP * r_j + log_wait_j                 r_j: the rank of the job's VC's
    s_j   = b_j + (w . norm(x_j) + head(...))       GPUs held among the window's VCs

with the network's output layer and linear term starting at zero, so the untrained
policy ranks exactly as `drf` (queue weights 1): the VC holding the fewest GPUs
first, within it and between tied VCs the longest wait first (equal waits tie, and
the policy puts the older first). `r_j` is the integer dense rank, recovered from the
feature `vc_share_rank` (rank / (number of distinct shares - 1)) by dividing by the
smallest positive value in the window; GAP exceeds any log10 wait (10: 300 years), so
the base is lexicographic whatever the number of VCs. PPO then learns a correction:
it reorders jobs of one VC as soon as it outweighs their difference in log wait, and
jobs of different VCs only where it outweighs GAP times their rank difference. The
base reads no run time (only the VC's held GPUs and the wait). A bounded correction
(`NetConfig.bound` = c > 0: c * tanh(out / c), zero where out is) keeps every
job's score within c of the base: two jobs of one VC swap only if the later one
waited less than 10^(2c) times as long, so no job is held back behind jobs that
arrived much later (the starvation an unbounded correction learned,
docs/results/rl-policy-experiments.md), and for 2c < GAP the order across VCs stays drf's.

The residual variant on `f1-unicep` (`NetConfig.base = "f1-unicep"`) is the same
network on the same two columns; the encoder fills them with `f1`'s key while the
`f1-unicep` rule is on `f1` and with unicep's (shared/policy_features.py,
F1_FEATURES) while it is on unicep, so its base is that heuristic's order.

The residual variant on `f1` (`NetConfig.base = "f1"`): the base is f1's key
(services/scoring/policies/f1.py: log10(r) n + 870 log10(s), r the estimate at
decision time, n the GPUs, s the seconds since the first submit + 1), which the
encoder computes as f1 does and carries in two columns (`f1_key`, rounded to
float32, and `f1_key_rest`, what the rounding left; the network itself never reads
them: they are 0 in its normalised input),

    k_j   = f1_key_j + f1_key_rest_j                (float64)
    b_j   = -scale * (k_j - min_i k_i)

so that, with the output layer at zero, the highest score is f1's first and the
stable sort (older first on ties) is f1's order (key, submit, seq): the served
scores of such a network are float64, so that keys apart by more than 1e-11 of
them never tie. The
window's least key is subtracted so the module's float32 scores stay small;
`scale` (default 1, `--residual-scale`) sets how sharp the sampling softmax around
f1's order is: two jobs whose keys differ by d are drawn in f1's order with odds
e^(scale d) : 1. A bounded correction c lets the network swap two jobs only where
their keys differ by less than 2c / scale: for 1-GPU jobs 2c / scale decades of
estimate, and in submit time about 0.53% x c / scale of the time since the first
submit (870 log10(s2 / s1) < 2c / scale).

Observation normalisation: running mean and variance of the job and cluster
features (CleanRL's RunningMeanStd), kept as buffers so a checkpoint carries
them; the trainer updates them between PPO iterations, never inside one. A
feature that never varied in training (`RunningMeanStd.varies`: the share of a
GPU and the allowed types on Philly, where every job asks for whole GPUs of any
type) is fed to the network as 0, its training value, whatever it is when
serving: its weights were never trained on it, and dividing by its near-zero
variance would turn any other value into the clip bound (10) times those
untrained weights, an arbitrary push. Such a job is scored as the jobs it
resembles in every feature that did vary.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

__all__ = [
    "BASES",
    "BASE_GAP",
    "KEY_BASES",
    "NetConfig",
    "RunningMeanStd",
    "ScoreNet",
    "WindowScorer",
    "f1_base",
    "f1_base_np",
]

BASES = ("drf", "f1", "f1-unicep")  # heuristic scores a residual network can start from
# the bases read off a key in the F1_FEATURES columns (f1's, or f1-unicep's rule's)
KEY_BASES = ("f1", "f1-unicep")
BASE_GAP = 10.0  # per rank of VC share: more than any log10(1 + wait in s)


@dataclass(frozen=True)
class NetConfig:
    n_job: int  # job features the network reads (after the ablation's selection)
    n_global: int  # cluster features
    hidden: int = 32
    context: bool = True  # False: the plain kernel, each job scored alone
    base: str = ""  # "drf": residual on drf's score (module doc); "": none
    base_rank_col: int = -1  # columns of vc_share_rank and log_wait_s in the input (base)
    base_wait_col: int = -1
    bound: float = 0.0  # > 0: the correction is bound * tanh(out / bound), in (-bound, bound)
    # base "f1": columns of f1_key and f1_key_rest in the input, and the scale of
    # f1's key in the score (the base is -scale * (key - the window's least))
    base_key_col: int = -1
    base_rest_col: int = -1
    base_scale: float = 1.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class RunningMeanStd(nn.Module):
    """Running mean / variance over rows (parallel-variance update, Chan et al.)."""

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    PRIOR_COUNT = 1e-4  # the prior (mean 0, variance 1) weighs this many rows

    def __init__(self, dim: int, clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(self.PRIOR_COUNT, dtype=torch.float64))
        self.clip = clip

    def varies(self) -> torch.Tensor:
        """[dim] bool: False where every row folded in had one value (a constant).

        From the buffers alone, so checkpoints made before it are judged too: after N
        rows all equal to c, the sum of squared deviations is what the prior left,
        n0 * (1 + c^2 N / (n0 + N)) <= n0 * (1 + c^2), with n0 = PRIOR_COUNT, while
        one row off the others by d adds about d^2 (a share of 0.5 among whole GPUs:
        0.25, three orders above). Twice the prior's part is the cut. Before any row
        (count below 1) every feature counts as varying: an untrained network
        normalises as it always did.
        """
        if float(self.count) < 1.0:
            return torch.ones_like(self.var, dtype=torch.bool)
        m2 = self.var * self.count
        return m2 > 2.0 * self.PRIOR_COUNT * (1.0 + self.mean.pow(2))

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
        live = self.varies().to(x.dtype)  # constants in training: 0 (module doc)
        return torch.clamp((x - mean) / std, -self.clip, self.clip) * live


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out))


class ScoreNet(nn.Module):
    hidden_cols: torch.Tensor

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
        # False where the network reads the column as an input, True where it is the
        # base's alone (f1's key: unbounded, relative to the episode's first submit)
        hidden_cols = torch.zeros(cfg.n_job, dtype=torch.bool)
        if cfg.base:
            cols = self.base_cols()
            if cfg.base not in BASES or min(cols) < 0:
                raise ValueError(f"residual base {cfg.base!r} needs its feature columns")
            if cfg.base in KEY_BASES:
                hidden_cols[list(cols)] = True
            out = cast(nn.Linear, self.head[2])
            nn.init.zeros_(out.weight)  # the untrained policy is the base heuristic
            nn.init.zeros_(out.bias)
        self.register_buffer("hidden_cols", hidden_cols, persistent=False)

    def base_cols(self) -> tuple[int, ...]:
        """The input columns the base reads (module doc)."""
        cfg = self.cfg
        if cfg.base in KEY_BASES:
            return (cfg.base_key_col, cfg.base_rest_col)
        return (cfg.base_rank_col, cfg.base_wait_col)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, g: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, N, n_job], mask [B, N] bool, g [B, n_global] -> scores [B, N], value [B]."""
        xn = self.job_norm(x)
        if self.cfg.base in KEY_BASES:
            xn = xn.masked_fill(self.hidden_cols, 0.0)
        e = self.embed(xn)
        m = mask.unsqueeze(-1).to(e.dtype)
        pooled = (e * m).sum(1) / m.sum(1).clamp(min=1.0)
        ctx = torch.cat([pooled, self.global_norm(g)], dim=-1)
        if self.cfg.context:
            inp = torch.cat([e, ctx.unsqueeze(1).expand(-1, e.shape[1], -1)], dim=-1)
        else:
            inp = e
        scores = (self.head(inp) + self.linear(xn)).squeeze(-1)
        if self.cfg.bound > 0:
            scores = self.cfg.bound * torch.tanh(scores / self.cfg.bound)
        cfg = self.cfg
        if cfg.base in KEY_BASES:
            scores = scores + f1_base(
                x[..., cfg.base_key_col], x[..., cfg.base_rest_col], mask, cfg.base_scale
            )
        elif cfg.base:
            scores = scores + drf_base(x[..., cfg.base_rank_col], x[..., cfg.base_wait_col], mask)
        scores = scores.masked_fill(~mask, float("-inf"))
        return scores, self.value_head(ctx).squeeze(-1)


def drf_base(rank: torch.Tensor, log_wait: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """drf's score [B, N] from the raw `vc_share_rank` and `log_wait_s` columns [B, N]
    (module doc): -GAP * integer rank of the VC's share + log wait."""
    pos = torch.where(mask & (rank > 0), rank, torch.full_like(rank, math.inf))
    step = pos.min(dim=-1, keepdim=True).values  # 1 / (distinct shares - 1); inf: one
    step = torch.where(torch.isfinite(step), step, torch.ones_like(step))
    return -BASE_GAP * torch.round(rank / step) + log_wait


def drf_base_np(rank: np.ndarray, log_wait: np.ndarray) -> np.ndarray:
    """`drf_base` of one window (every row a job), in numpy, float32."""
    pos = rank[rank > 0]
    step = pos.min() if len(pos) else np.float32(1.0)
    out: np.ndarray = np.float32(-BASE_GAP) * np.round(rank / step) + log_wait
    return out


def f1_base(
    key: torch.Tensor, rest: torch.Tensor, mask: torch.Tensor, scale: float = 1.0
) -> torch.Tensor:
    """f1's score [B, N] from the `f1_key` and `f1_key_rest` columns [B, N] (module
    doc): -scale x (key - the least key of the window's valid jobs), computed in float64,
    returned in the columns' dtype (lowest key = highest score = first, as f1)."""
    k = key.double() + rest.double()
    least = torch.where(mask, k, torch.full_like(k, math.inf)).min(-1, keepdim=True).values
    least = torch.where(torch.isfinite(least), least, torch.zeros_like(least))
    return (-scale * (k - least)).to(key.dtype)


def f1_base_np(key: np.ndarray, rest: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """`f1_base` of one window (every row a job), in numpy, float64 (module doc)."""
    k = key.astype(np.float64) + rest.astype(np.float64)
    out: np.ndarray = -scale * (k - k.min())
    return out


class WindowScorer:
    """`ScoreNet`'s scores for one window, computed in numpy from the weights copied
    out of `net`: the same operations as `ScoreNet.forward` (float32), without
    PyTorch's per-call overhead, which dominates a window of a few small matrix
    products. Serving and rollouts use it; training's gradients use the module.

    The copies follow the module: every in-place change of a parameter or buffer
    (an optimiser step, `load_state_dict`, a normaliser update) bumps that tensor's
    version counter, and a changed version makes the next call copy the weights
    again. The value head is not needed to rank, so it is not computed.
    """

    def __init__(self, net: ScoreNet) -> None:
        self.net = net
        self._tensors = [*net.parameters(), *net.buffers()]
        self._seen: tuple[int, ...] | None = None

    def _versions(self) -> tuple[int, ...]:
        return tuple(t._version for t in self._tensors)

    def _copy_weights(self) -> None:
        net = self.net

        def arr(t: torch.Tensor) -> np.ndarray:
            return np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy())

        def norm(rms: RunningMeanStd) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
            mean = arr(rms.mean)
            std = np.sqrt(arr(rms.var) + np.float32(1e-8))  # forward's float32 order
            return mean, std, rms.clip, arr(rms.varies())

        self._job_norm, self._global_norm = norm(net.job_norm), norm(net.global_norm)
        if net.cfg.base in KEY_BASES:  # the base's own columns are not inputs (forward)
            mean, std, clip, live = self._job_norm
            self._job_norm = (mean, std, clip, live * (1 - arr(net.hidden_cols)))
        l1, l2, h1, h2 = (cast(nn.Linear, m) for m in (net.embed[0], net.embed[2],
                                                        net.head[0], net.head[2]))  # fmt: skip
        self._w1, self._b1 = arr(l1.weight).T.copy(), arr(l1.bias)
        self._w2, self._b2 = arr(l2.weight).T.copy(), arr(l2.bias)
        hw = arr(h1.weight)
        h = net.cfg.hidden
        self._wh_e, self._wh_ctx, self._bh = hw[:, :h].T.copy(), hw[:, h:].T.copy(), arr(h1.bias)
        self._wo, self._bo = arr(h2.weight).T.copy(), arr(h2.bias)
        self._wl = arr(net.linear.weight).T.copy()
        self._seen = self._versions()

    def __call__(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Scores [n] of the jobs `x` [n, n_job] (every row a job) in cluster `g` [n_global]
        (float32; float64 for a residual on f1)."""
        if self._versions() != self._seen:
            self._copy_weights()
        mean, std, clip, live = self._job_norm
        xn = np.clip((x.astype(np.float32, copy=False) - mean) / std, -clip, clip) * live
        e = np.tanh(np.tanh(xn @ self._w1 + self._b1) @ self._w2 + self._b2)
        hid = e @ self._wh_e + self._bh
        if self.net.cfg.context:
            gmean, gstd, gclip, glive = self._global_norm
            gn = np.clip((g.astype(np.float32, copy=False) - gmean) / gstd, -gclip, gclip)
            gn *= glive
            pooled = e.sum(0) / np.float32(max(len(e), 1))
            hid += np.concatenate([pooled, gn]) @ self._wh_ctx
        out: np.ndarray = (np.tanh(hid) @ self._wo + self._bo + xn @ self._wl)[:, 0]
        cfg = self.net.cfg
        if cfg.bound > 0:
            b = np.float32(cfg.bound)
            out = b * np.tanh(out / b)
        if cfg.base in KEY_BASES:
            base = f1_base_np(x[:, cfg.base_key_col], x[:, cfg.base_rest_col], cfg.base_scale)
            return out.astype(np.float64) + base  # float64: distinct keys do not tie
        elif cfg.base:
            x32 = x.astype(np.float32, copy=False)
            out = out + drf_base_np(x32[:, cfg.base_rank_col], x32[:, cfg.base_wait_col])
        return out
