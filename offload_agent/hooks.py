"""PyTorch hooks that tell the engine when each tensor is about to be used.

* forward: `register_forward_pre_hook` fetches (and pins) a module's own
  parameters; `register_forward_hook` unpins them.
* backward: autograd keeps tensors for backward; a parameter saved that way
  would pin a buffer that the cache wants to reuse (or, worse, be read after
  the buffer was refilled). `saved_tensors_hooks` replaces every saved view of a
  cached tensor with a reference (id, shape, strides, offset); the unpack hook
  fetches the tensor again and rebuilds the view, pinning it until the
  parameter's optimizer step.
* optimizer: `register_post_accumulate_grad_hook` runs the per-parameter
  AdamW step as soon as the gradient is complete, then frees the gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

__all__ = ["HookTarget", "SavedRef", "install_hooks", "saved_tensor_refs"]


class HookTarget(Protocol):
    def use(self, tensor_id: str) -> torch.Tensor: ...

    def release(self, tensor_id: str, *, all_pins: bool = False) -> None: ...

    def owner_of(self, t: torch.Tensor) -> tuple[str, torch.Tensor] | None: ...

    def optimizer_step(self, tensor_id: str, param: nn.Parameter) -> None: ...


@dataclass(frozen=True, slots=True)
class SavedRef:
    tensor_id: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # elements from the start of the cached tensor


def install_hooks(
    model: nn.Module, names: dict[nn.Parameter, str], target: HookTarget
) -> list[Any]:
    handles: list[Any] = []
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p in names]
        if not own:
            continue
        ids = [names[p] for p in own]
        handles.append(module.register_forward_pre_hook(_pre(ids, target)))
        handles.append(module.register_forward_hook(_post(ids, target)))
    for p, tid in names.items():
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(_opt(tid, target)))
    return handles


def _pre(ids: list[str], target: HookTarget) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any) -> None:
        for tid in ids:
            target.use(tid)

    return hook


def _post(ids: list[str], target: HookTarget) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        for tid in ids:
            target.release(tid)

    return hook


def _opt(tid: str, target: HookTarget) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        assert isinstance(param, nn.Parameter)
        target.optimizer_step(tid, param)

    return hook


@contextmanager
def saved_tensor_refs(target: HookTarget) -> Iterator[None]:
    """While active, cached tensors saved for backward are kept as references."""

    def pack(t: torch.Tensor) -> Any:
        found = target.owner_of(t)
        if found is None:
            return t
        tid, base = found
        offset = (t.data_ptr() - base.data_ptr()) // t.element_size()
        return SavedRef(tid, tuple(t.size()), tuple(t.stride()), offset)

    def unpack(packed: Any) -> torch.Tensor:
        if not isinstance(packed, SavedRef):
            return packed
        base = target.use(packed.tensor_id)
        return base.as_strided(packed.size, packed.stride, base.storage_offset() + packed.offset)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
