"""Mixed precision as ZeRO-Offload does it: fp32 master weights and fp32 AdamW
states live in the slow tiers like any other state; the model computes with
bf16 or fp16 working copies (what the fast tier holds for forward and
backward); each optimizer step updates the master in fp32 and writes the
working copy back as its rounding.

With fp16, the loss is scaled before backward (`LossScaler.scale`, as
`torch.amp.GradScaler.scale`), every gradient is kept until the step's end,
unscaled in fp32 and checked for inf/NaN before any parameter steps; a step
with a non-finite gradient is skipped whole (no parameter, state or step
count changes) and the scale backs off; after `growth_interval` clean steps it
grows. The arithmetic is GradScaler's, so a loop with fp32 masters, fp16
working weights and `torch.amp.GradScaler` gives the same numbers bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MASTER_KIND", "PRECISIONS", "LossScale", "LossScaler", "unscaled"]

MASTER_KIND = "master"  # the fp32 copy of a parameter trained in bf16/fp16
PRECISIONS: dict[str, torch.dtype | None] = {
    "fp32": None,  # the parameters' own dtype, no master copy
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


@dataclass(frozen=True, slots=True)
class LossScale:
    """Dynamic loss scaling for fp16, with `torch.amp.GradScaler`'s defaults."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        if not (self.init_scale > 0 and math.isfinite(self.init_scale)):
            raise ValueError(
                f"loss scale init_scale must be a positive number, not {self.init_scale}"
            )
        if not self.growth_factor > 1.0:
            raise ValueError(f"loss scale growth_factor must be > 1, not {self.growth_factor}")
        if not 0.0 < self.backoff_factor < 1.0:
            raise ValueError(
                f"loss scale backoff_factor must be in (0, 1), not {self.backoff_factor}"
            )
        if self.growth_interval < 1:
            raise ValueError(f"loss scale growth_interval must be >= 1, not {self.growth_interval}")


class LossScaler:
    """The scale and its growth counter (what GradScaler keeps), on one device."""

    def __init__(self, config: LossScale, device: torch.device) -> None:
        self.config = config
        self._scale = torch.full((), config.init_scale, dtype=torch.float32, device=device)
        self.growth_tracker = 0

    @property
    def value(self) -> float:
        return float(self._scale)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale.to(loss.device)

    def inv_scale(self) -> torch.Tensor:
        """1 / scale, computed as GradScaler computes it (in double, then fp32)."""
        return self._scale.double().reciprocal().float()

    def update(self, found_inf: bool) -> None:
        """After a step: back off on inf/NaN, grow after `growth_interval` clean steps
        (`torch._amp_update_scale_`)."""
        c = self.config
        if found_inf:
            self._scale.mul_(c.backoff_factor)
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == c.growth_interval:
            grown = self._scale * c.growth_factor
            if torch.isfinite(grown):
                self._scale.copy_(grown)
            self.growth_tracker = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.value, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale.fill_(float(state["scale"]))
        self.growth_tracker = int(state["growth_tracker"])


@torch.no_grad()
def unscaled(grad: torch.Tensor, inv_scale: torch.Tensor | None) -> torch.Tensor:
    """The gradient of a working copy as an fp32 gradient of its master, divided by
    the loss scale (`GradScaler.unscale_` on a master whose `.grad` is the
    working gradient converted to fp32). A new tensor: the kept gradient stays."""
    g = grad.float() if grad.dtype != torch.float32 else grad.clone()
    if inv_scale is not None:
        g.mul_(inv_scale.to(g.device))
    return g
