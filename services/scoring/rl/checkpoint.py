"""Checkpoints: one plain file (torch.save of tensors and plain values, read
back with `weights_only=True`) holding the network, its normalisation, the
feature names it reads and how it was trained (config, trace, clusters).

A checkpoint names its features; loading one whose names this encoder does not
produce, in the same meaning, is refused with one line (`UserError`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from services.scoring.rl.network import NetConfig, ScoreNet
from shared.errors import UserError
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES

__all__ = ["FORMAT", "Checkpoint", "load_checkpoint", "save_checkpoint"]

FORMAT = "rltune-rl/1"


@dataclass
class Checkpoint:
    net: ScoreNet
    features: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)  # how it was trained
    optimizer: dict[str, Any] | None = None  # for resuming
    state: dict[str, Any] = field(default_factory=dict)  # trainer counters, for resuming


def save_checkpoint(path: str | Path, ckpt: Checkpoint) -> None:
    """Write atomically (a temporary file renamed over `path`)."""
    path = Path(path)
    data = {
        "format": FORMAT,
        "features": list(ckpt.features),
        "global_features": list(GLOBAL_FEATURES),
        "net_config": ckpt.net.cfg.to_dict(),
        "state_dict": ckpt.net.state_dict(),
        "meta": ckpt.meta,
        "optimizer": ckpt.optimizer,
        "state": ckpt.state,
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, tmp)
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from exc


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint; UserError (one line) if unreadable or made for other features."""
    path = Path(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"checkpoint {path}: no such file") from None
    except Exception as exc:  # torch raises many kinds on a file that is not a checkpoint
        raise UserError(
            f"checkpoint {path}: not a readable rltune checkpoint ({_why_unreadable(path, exc)})"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"checkpoint {path}: not an rltune RL checkpoint (format {FORMAT})")
    features = tuple(data["features"])
    unknown = [f for f in features if f not in JOB_FEATURES]
    if unknown or list(data["global_features"]) != list(GLOBAL_FEATURES):
        what = ", ".join(unknown) if unknown else "the cluster features"
        raise UserError(
            f"checkpoint {path}: its features do not match this encoder ({what}); "
            "retrain it with `rltune train`"
        )
    cfg = NetConfig(**data["net_config"])
    if cfg.n_job != len(features) or cfg.n_global != len(GLOBAL_FEATURES):
        raise UserError(f"checkpoint {path}: network size does not match its feature list")
    net = ScoreNet(cfg)
    net.load_state_dict(data["state_dict"])
    return Checkpoint(
        net, features, dict(data.get("meta") or {}), data.get("optimizer"), data.get("state") or {}
    )


def _why_unreadable(path: Path, exc: Exception) -> str:
    """One short clause: torch's own messages run to a paragraph (the weights-only
    advice), which says nothing useful about a file that is not a checkpoint at all."""
    with contextlib.suppress(OSError), path.open("rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return "not a torch.save file: no zip archive"
    text = " ".join(str(exc).split()) or type(exc).__name__
    first = text.split(". ")[0]
    return first if len(first) <= 160 else first[:157] + "..."
