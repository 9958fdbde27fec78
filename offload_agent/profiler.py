"""Warm-up recording: which tensors exist, how big, and in what order one step
touches them (forward pre-hooks, saved-tensor unpacks in backward, and the
per-parameter optimizer step), as a `TensorProfile`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from offload_agent.residency import TensorSpec
from shared.messages import TensorProfile

__all__ = ["Recorder"]


class Recorder:
    """Collects the access order while `active`; one step is enough (it repeats)."""

    def __init__(self) -> None:
        self.active = False
        self.order: list[str] = []
        self._t0 = 0.0
        self.step_ms = 0.0

    def start(self) -> None:
        self.order = []
        self.active = True
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self.active = False
        self.step_ms = (time.perf_counter() - self._t0) * 1e3

    def on_use(self, tensor_id: str) -> None:
        if self.active:
            self.order.append(tensor_id)

    def profile(
        self,
        job_id: str,
        specs: Sequence[TensorSpec],
        *,
        fast_budget: int = 0,
        host_budget: int = 0,
        node_id: str = "",
    ) -> TensorProfile:
        return TensorProfile(
            job_id=job_id,
            tensors=[
                (s.tensor_id, s.nbytes, str(s.dtype).removeprefix("torch."), s.kind) for s in specs
            ],
            order=list(self.order),
            step_ms=self.step_ms,
            fast_budget_bytes=fast_budget,
            host_budget_bytes=host_budget,
            node_id=node_id,
        )
