"""The learned prioritisation policy (`--policy rl`, `rl:PATH`): network,
policy object, PPO pieces, episodes and the trainer. Network and observation
encoding are importable on their own: the scoring service serves them.
"""

from __future__ import annotations

from pathlib import Path

from services.scoring.rl.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from services.scoring.rl.network import NetConfig, ScoreNet
from services.scoring.rl.policy import RLPolicy

__all__ = [
    "SHIPPED",
    "Checkpoint",
    "NetConfig",
    "RLPolicy",
    "ScoreNet",
    "load_checkpoint",
    "load_policy",
    "save_checkpoint",
]

SHIPPED = Path(__file__).resolve().parents[3] / "models" / "rl.pt"


def load_policy(path: str | None = None) -> RLPolicy:
    """The policy of checkpoint `path`, or of the shipped one (`models/rl.pt`)."""
    ckpt = load_checkpoint(path or SHIPPED)
    label = "rl" if path is None else f"rl:{Path(path).stem}"
    return RLPolicy(ckpt.net, ckpt.features, label=label)
