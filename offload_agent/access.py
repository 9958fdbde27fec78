"""What the hooks call while a step runs (`hooks.HookTarget`): fetch and release
cached tensors, pin the ones a view lives on, tell a parameter's NaN placeholder,
and hand a complete gradient on to the optimizer.

The engine (engine.py) owns one `HookAccess` and gives it to the hooks in its
place. It holds the step's access state: whether a step is active (every use
outside one is refused) and which tensors this step fetched (a gradient for a
parameter never fetched means the forward read its placeholder).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from offload_agent.cache import TensorCache
from offload_agent.profiler import Recorder

__all__ = ["HookAccess"]

log = logging.getLogger("rltune.offload")


class HookAccess:
    def __init__(
        self,
        cache: Callable[[], TensorCache],
        recorder: Recorder,
        fast_device: torch.device,
        gradient: Callable[[str, torch.Tensor], None],
    ) -> None:
        self._cache, self.recorder, self.fast_device = cache, recorder, fast_device
        self._gradient = gradient  # a parameter's complete gradient goes here
        self.in_step = False
        self.fetched: set[str] = set()  # tensors fetched in this step
        self.loose: set[str] = set()  # parameters read outside their modules' forward
        # storage pointer of a parameter's NaN placeholder -> the parameter (`start`)
        self.placeholders: dict[int, str] = {}

    def use(self, tensor_id: str) -> torch.Tensor:
        if not self.in_step:
            raise RuntimeError(
                f"{tensor_id} is used outside `with engine.step():`; run every forward and "
                "backward (evaluation too) inside it"
            )
        self.recorder.on_use(tensor_id)
        self.fetched.add(tensor_id)
        return self._cache().use(tensor_id)

    def release(self, tensor_id: str, *, all_pins: bool = False) -> None:
        self._cache().release(tensor_id, all_pins=all_pins)

    def pinned(self, tensor_id: str) -> bool:
        return self._cache().residency[tensor_id].pins > 0

    def pin(self, tensor_id: str) -> None:
        """One more pin on a tensor in the fast tier (a view of it lives on)."""
        entry = self._cache().residency[tensor_id]
        assert entry.fast_slot is not None, tensor_id
        entry.pins += 1

    def placeholder_of(self, t: torch.Tensor) -> str | None:
        """The parameter whose NaN placeholder `t` is (or views), if any."""
        if t.layout is not torch.strided:
            return None
        return self.placeholders.get(t.untyped_storage().data_ptr())

    def use_loose(self, tensor_id: str) -> None:
        """A parameter read with no module hook around it: fetch it (the caller
        releases it after the op)."""
        if tensor_id not in self.loose:
            self.loose.add(tensor_id)
            log.info(
                "%s is read outside the forward of its module (e.g. weight tying through "
                "F.linear); it is fetched for each op that reads it",
                tensor_id,
            )
        self.use(tensor_id)

    def owner_of(self, t: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        cache = self._cache()
        if t.device != self.fast_device:
            return None
        entry = cache.owner(t)
        return None if entry is None else (entry.spec.tensor_id, entry.fast_view())

    def optimizer_step(self, tensor_id: str, param: nn.Parameter) -> None:
        """A parameter's gradient is complete: step it now, or (accumulation,
        clipping, fp16) add it to the step's sum and step at the end."""
        grad = param.grad
        assert grad is not None
        param.grad = None
        if not self.in_step:
            raise RuntimeError(
                f"backward reached {tensor_id} outside `with engine.step():`; run every "
                "forward and backward inside it"
            )
        if tensor_id not in self.fetched:
            raise RuntimeError(
                f"{tensor_id} has a gradient but was not fetched in this step: the forward "
                "read its placeholder, outside the forward of its module, in a way the "
                "first step did not show; set EngineConfig(watch_loose=True)"
            )
        self._gradient(tensor_id, grad)
