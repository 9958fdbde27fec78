"""What happens to a gradient once backward completes it: the per-parameter
AdamW step right away, or (accumulation, clipping, fp16) a running sum kept in
the cache and stepped at the step's end, after the global norm and the
inf/NaN check over all of them, as DeepSpeed does.

`GradientSteps` owns the optimizer's settings and counts, the loss scaler and
the map to fp32 masters; it reaches tensors only through the cache (`use`
fetches and pins, the cache releases and marks them changed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from offload_agent.cache import TensorCache
from offload_agent.optim import (
    GRAD_KIND,
    STATE_KINDS,
    Optimizer,
    Slices,
    adamw_step,
    clip_coefficient,
    slice_id,
    state_id,
)
from offload_agent.precision import LossScaler, unscaled

__all__ = ["GradientSteps"]

log = logging.getLogger("rltune.offload")


class GradientSteps:
    def __init__(
        self,
        optim: Optimizer,
        *,
        order: list[str],
        masters: dict[str, str],
        scaler: LossScaler | None,
        accumulation_steps: int,
        max_grad_norm: float | None,
        use: Callable[[str], torch.Tensor],
        cache: Callable[[], TensorCache],
        sliced: dict[str, Slices] | None = None,
    ) -> None:
        self.optim, self.order, self.masters, self.scaler = optim, order, masters, scaler
        self.sliced = sliced or {}
        self.k, self.max_norm = accumulation_steps, max_grad_norm
        self._use, self._cache = use, cache
        # clipping and fp16's overflow check need every gradient before any step
        self.step_at_end = max_grad_norm is not None or scaler is not None
        self.keep = accumulation_steps > 1 or self.step_at_end
        self.stepped: set[str] = set()  # parameters stepped in this step
        self.backwards: dict[str, int] = {}  # this step's gradients per parameter
        self.last_grad_norm: float | None = None  # before clipping, of the last step
        self.skipped_steps = 0  # fp16 steps skipped on an inf/NaN gradient

    def begin(self) -> None:
        self.backwards.clear()
        self.stepped.clear()

    def on_gradient(self, tensor_id: str, grad: torch.Tensor) -> None:
        """A parameter's gradient is complete: step it now, or add it to the step's sum."""
        if not self.keep:
            if tensor_id in self.stepped:
                raise RuntimeError(
                    f"{tensor_id} got a second gradient in one backward pass (a module reused "
                    "under reentrant activation checkpointing?): use use_reentrant=False, "
                    "or set max_grad_norm so gradients are summed before the step"
                )
            self._adamw(tensor_id, grad)
            return
        seen = self.backwards.get(tensor_id, 0) + 1
        if self.k > 1 and seen > self.k:
            raise RuntimeError(
                f"{tensor_id} got gradient {seen} in one step, but accumulation_steps is "
                f"{self.k}: run that many backward passes per `with engine.step():`"
            )
        self.backwards[tensor_id] = seen
        total_id = state_id(tensor_id, GRAD_KIND)
        total = self._use(total_id)
        with torch.no_grad():  # the order PyTorch sums `.grad` in: ((g1 + g2) + g3) ...
            if seen == 1:
                total.copy_(grad)
            else:
                total.add_(grad)
        del grad
        cache = self._cache()
        if seen == self.k and not self.step_at_end:
            self._adamw(tensor_id, total)
        else:  # backward is done with the parameter (its gradient is complete)
            cache.release(tensor_id, all_pins=True)
        cache.mark_dirty(total_id)
        cache.release(total_id, all_pins=True)

    def finish(self, step: int) -> None:
        """The step's end: check (fp16), clip and step every kept gradient, or step
        the parameters that missed some micro-batches (an expert no token was
        routed to) on the sum they got, as `torch.optim` would."""
        cache = self._cache()
        if not self.step_at_end:
            for tensor_id, seen in self.backwards.items():
                if seen < self.k:
                    total_id = state_id(tensor_id, GRAD_KIND)
                    self._adamw(tensor_id, self._use(total_id))
                    cache.release(total_id, all_pins=True)
            return
        ids = [t for t in self.order if t in self.backwards]  # parameter order
        if not ids:
            return
        inv = self.scaler.inv_scale() if self.scaler is not None else None
        norms, finite = [], True
        for tid in ids:  # first pass: every gradient's norm and inf/NaN check, no step
            grad = self._grad(tid, inv)
            if inv is not None:
                finite = finite and bool(torch.isfinite(grad).all())
            if self.max_norm is not None:
                norms.append(torch.linalg.vector_norm(grad, 2.0))
            cache.release(state_id(tid, GRAD_KIND), all_pins=True)
        if not finite:  # fp16 overflow: skip the whole step, as GradScaler.step does
            assert self.scaler is not None
            self.skipped_steps += 1
            self.last_grad_norm = float("inf")
            log.info("fp16 step %d skipped: inf/NaN gradient at loss scale %g", step,
                     self.scaler.value)  # fmt: skip
            self.scaler.update(found_inf=True)
            return
        coef = None
        if self.max_norm is not None:
            self.last_grad_norm, coef = clip_coefficient(norms, self.max_norm)
        for tid in ids:
            grad = self._grad(tid, inv)
            if coef is not None:
                with torch.no_grad():
                    grad.mul_(coef)
            self._adamw(tid, grad)
            cache.release(state_id(tid, GRAD_KIND), all_pins=True)
        if self.scaler is not None:
            self.scaler.update(found_inf=False)

    def _grad(self, tensor_id: str, inv_scale: torch.Tensor | None) -> torch.Tensor:
        """A parameter's kept gradient, fetched and pinned: the cached sum itself in
        fp32 training, an unscaled fp32 copy of it under mixed precision."""
        kept = self._use(state_id(tensor_id, GRAD_KIND))
        return unscaled(kept, inv_scale) if tensor_id in self.masters else kept

    def _adamw(self, tensor_id: str, grad: torch.Tensor) -> None:
        """One AdamW step; under mixed precision on the fp32 master, whose rounding
        then becomes the working copy."""
        self.stepped.add(tensor_id)
        cut = self.sliced.get(tensor_id)
        if cut is not None:
            self._adamw_sliced(tensor_id, grad, cut)
            return
        p = self._use(tensor_id)
        m, v = (self._use(state_id(tensor_id, k)) for k in STATE_KINDS)
        master = self.masters.get(tensor_id)
        ids = [tensor_id, *(state_id(tensor_id, k) for k in STATE_KINDS)]
        if master is None:
            self.optim.step(tensor_id, p, grad, m, v)
        else:
            w = self._use(master)
            g = grad if grad.dtype == torch.float32 else unscaled(grad, None)
            self.optim.step(tensor_id, w, g, m, v)
            with torch.no_grad():
                p.copy_(w)
            ids.append(master)
        cache = self._cache()
        for tid in ids:
            cache.mark_dirty(tid)
            cache.release(tid, all_pins=True)

    def _adamw_sliced(self, tensor_id: str, grad: torch.Tensor, cut: Slices) -> None:
        """`_adamw` for a parameter whose states are sliced: the same elementwise
        step, slice by slice over the flattened parameter (or master) and
        gradient; each slice's states are fetched, stepped, marked changed and
        released before the next, so they stream through the cache."""
        cache = self._cache()
        p = self._use(tensor_id)
        master = self.masters.get(tensor_id)
        w = p if master is None else self._use(master)
        g = grad if master is None or grad.dtype == torch.float32 else unscaled(grad, None)
        n = self.optim.count(tensor_id)
        cfg = self.optim.config(tensor_id)
        flat_w, flat_g = w.view(-1), g.reshape(-1)
        m_id, v_id = (state_id(tensor_id, k) for k in STATE_KINDS)
        for i, (a, b) in enumerate(cut.bounds()):
            ids = (slice_id(m_id, i), slice_id(v_id, i))
            m, v = (self._use(t)[: b - a] for t in ids)
            adamw_step(cfg, n, flat_w[a:b], flat_g[a:b], m, v)
            del m, v
            for tid in ids:
                cache.mark_dirty(tid)
                cache.release(tid, all_pins=True)
        if master is not None:
            with torch.no_grad():
                p.copy_(w)
            cache.mark_dirty(master)
            cache.release(master, all_pins=True)
        cache.mark_dirty(tensor_id)
        cache.release(tensor_id, all_pins=True)
