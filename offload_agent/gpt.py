"""A small GPT (decoder-only transformer) for the example, the benchmark and tests.

Plain `nn.Linear` / `nn.LayerNorm` / `nn.Embedding` modules, no weight tying,
so every parameter is used by the module that owns it (what the engine's
module hooks assume).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["GPT", "GPTConfig", "batch"]


@dataclass(frozen=True, slots=True)
class GPTConfig:
    vocab: int = 512
    seq: int = 64
    layers: int = 2
    dim: int = 128
    heads: int = 4

    def param_count(self) -> int:
        per_layer = 12 * self.dim * self.dim + 13 * self.dim
        return (
            2 * self.vocab * self.dim + self.seq * self.dim + self.layers * per_layer + 2 * self.dim
        )


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.fc = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.out = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.seq, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def batch(cfg: GPTConfig, size: int, step: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch of token ids (input, next-token targets) for `step`."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    data = torch.randint(0, cfg.vocab, (size, cfg.seq + 1), generator=g)
    return data[:, :-1], data[:, 1:]
