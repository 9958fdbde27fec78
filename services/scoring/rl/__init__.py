"""The learned prioritisation policy (`--policy rl`, `rl:PATH`): network,
policy object, PPO pieces, episodes and the trainer. Network and observation
encoding are importable on their own: the scoring service serves them.

The names below are imported on first use (PEP 562), so that importing a
torch-free submodule (`rl.args`, which the command line reads to build its
flags) does not import torch: every `rltune` process, each service included,
would otherwise pay for it at start.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_LAZY = {
    "Checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "NetConfig": "network",
    "ScoreNet": "network",
    "RLPolicy": "policy",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def load_policy(path: str | None = None) -> RLPolicy:
    """The policy of checkpoint `path`, or of the shipped one (`models/rl.pt`)."""
    from services.scoring.rl.checkpoint import load_checkpoint
    from services.scoring.rl.policy import RLPolicy

    ckpt = load_checkpoint(path or SHIPPED)
    label = "rl" if path is None else f"rl:{Path(path).stem}"
    bound = ckpt.meta.get("max_wait_s")  # the wait bound it was trained with, if any
    return RLPolicy(
        ckpt.net,
        ckpt.features,
        label=label,
        max_wait_s=None if bound is None else float(bound),
        bound_gpus=int(ckpt.meta.get("bound_gpus", 1)),
        bound_scale=str(ckpt.meta.get("bound_scale", "fixed")),
        needs=ckpt.meta.get("needs"),
    )
