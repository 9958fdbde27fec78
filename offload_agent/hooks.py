"""PyTorch hooks that tell the engine when each tensor is about to be used.

* forward: `register_forward_pre_hook` fetches (and pins) a module's own
  parameters; `register_forward_hook` unpins them.
* backward: autograd keeps tensors for backward; a parameter saved that way
  would pin a buffer that the cache wants to reuse (or, worse, be read after
  the buffer was refilled). `saved_tensors_hooks` replaces every saved view of a
  cached tensor with a reference (id, shape, strides, offset); the unpack hook
  fetches the tensor again and rebuilds the view, pinned while autograd holds
  that view (it drops it right after the backward function that needed it; a
  `weakref.finalize` releases the pin then), so a module applied several
  times (ALBERT's one shared layer) holds its buffers only while each use's
  backward runs.
* activation checkpointing: the recomputation in backward runs a module's
  forward again, and the checkpoint keeps what that forward saves in its own
  storage (its saved-tensor hooks sit inside ours), as views of the fast
  buffers. So a module's forward inside backward keeps its parameters pinned
  until their optimizer step (or the step's end, for frozen ones) instead of
  releasing them when the forward returns: no buffer is refilled under those
  views.
* optimizer: `register_post_accumulate_grad_hook` runs the per-parameter
  AdamW step as soon as the gradient is complete, then frees the gradient.
* a parameter read outside the forward of a module that owns it (weight tying
  through `F.linear(x, self.tok.weight)`, a parent reading a child's weight):
  no module hook announces it. `LooseParams`, a torch function mode active
  for the first step (and for every later step if it found any), catches any
  op that receives a parameter that is not pinned and fetches it, pinned for
  that op only, as a module's hooks would; a copy saved for backward becomes
  a reference like any other. Module-level tying (`head.weight = tok.weight`)
  needs none of this: the same parameter simply has two owners.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["HookTarget", "LooseParams", "SavedRef", "install_hooks", "saved_tensor_refs"]


class HookTarget(Protocol):
    def use(self, tensor_id: str) -> torch.Tensor: ...

    def release(self, tensor_id: str, *, all_pins: bool = False) -> None: ...

    def owner_of(self, t: torch.Tensor) -> tuple[str, torch.Tensor] | None: ...

    def optimizer_step(self, tensor_id: str, param: nn.Parameter) -> None: ...

    def pinned(self, tensor_id: str) -> bool: ...

    def use_loose(self, tensor_id: str) -> None: ...


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


def in_backward() -> bool:
    """True while autograd runs a backward pass (a checkpoint's recomputation)."""
    return bool(torch._C._current_graph_task_id() != -1)


def _post(ids: list[str], target: HookTarget) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if in_backward():  # recomputed for a checkpoint: its saved views need these
            return
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
        view = base.as_strided(packed.size, packed.stride, base.storage_offset() + packed.offset)
        weakref.finalize(view, target.release, packed.tensor_id)
        return view

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


class LooseParams(TorchFunctionMode):
    """Fetches, and pins for the op, any parameter an op receives while no module
    hook has it pinned; without it such an op would read the parameter's NaN
    placeholder, or a buffer another tensor now owns."""

    def __init__(self, names: dict[nn.Parameter, str], target: HookTarget) -> None:
        super().__init__()
        self.names = names
        self.target = target

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _ACCESSORS:  # `p.data = view`, `p.grad`: no read
            return func(*args, **kwargs)
        fetched = []
        for a in _params_in(args, kwargs):
            tid = self.names.get(a)
            if tid is not None and not self.target.pinned(tid):
                self.target.use_loose(tid)
                fetched.append(tid)
        try:
            return func(*args, **kwargs)
        finally:
            for tid in fetched:
                self.target.release(tid)


_ACCESSORS = frozenset({"__get__", "__set__", "__delete__"})


def _params_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[nn.Parameter]:
    """Parameters among the arguments, and one level into lists and tuples
    (`torch.cat([w1, w2])`); deeper nesting is not how ops take weights."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, nn.Parameter):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, nn.Parameter):
                    yield b
