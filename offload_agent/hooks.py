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
  op that receives a parameter that is not pinned, and any view property read
  of one (`.T`, `.mT`, `.H`, `.mH`, `.data`), and fetches it, pinned for that
  op, as a module's hooks would; a copy saved for backward becomes a
  reference like any other. Module-level tying (`head.weight = tok.weight`)
  needs none of this: the same parameter simply has two owners.
* views: an op that returns a view of a cached tensor (`p.T`, `p[0]`,
  `p.view(...)`, `p.expand(...)`, `p.detach()`, and views of those) would
  outlive the pin of the op that fetched it, and a module may return a view
  of its own parameter (`return self.weight.T`) past its forward hook.
  `ViewPins` keeps the tensor pinned for as long as such a view lives (a
  `weakref.finalize` releases it), so no buffer is refilled under a view.
  A view still referenced when the step ends is refused: the cache reuses
  the buffer after the step.
* a read of a parameter's NaN placeholder (a loose read the first step did
  not show, with the watch off) is an error naming the parameter: when
  autograd saves the placeholder (`saved_tensor_refs`); else, at the end of
  the model's forward, when the graph of its outputs leads to a parameter
  that was not fetched in the step (`graph_params`: an op that saves
  nothing, `x @ p` with no gradient for `x`, read the placeholder), before
  backward steps anything; else when a gradient arrives for such a
  parameter (a read after the model's forward returned, in the loss).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = [
    "HookTarget",
    "LooseParams",
    "SavedRef",
    "ViewPins",
    "graph_params",
    "install_hooks",
    "saved_tensor_refs",
]


class HookTarget(Protocol):
    def use(self, tensor_id: str) -> torch.Tensor: ...

    def release(self, tensor_id: str, *, all_pins: bool = False) -> None: ...

    def owner_of(self, t: torch.Tensor) -> tuple[str, torch.Tensor] | None: ...

    def optimizer_step(self, tensor_id: str, param: nn.Parameter) -> None: ...

    def pinned(self, tensor_id: str) -> bool: ...

    def use_loose(self, tensor_id: str) -> None: ...

    def pin(self, tensor_id: str) -> None: ...

    def placeholder_of(self, t: torch.Tensor) -> str | None: ...


@dataclass(frozen=True, slots=True)
class SavedRef:
    tensor_id: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # elements from the start of the cached tensor


class ViewPins:
    """Views of cached tensors that may outlive the pin of whatever fetched them
    (an op in `LooseParams`, a module's forward): each holds one pin on its
    tensor until the view is garbage (`weakref.finalize`), so the cache never
    refills a buffer a live view points into."""

    def __init__(self, target: HookTarget) -> None:
        self.target = target
        self.live: dict[int, str] = {}  # id(view) -> tensor id, while the view lives
        self.seen: set[str] = set()  # tensors ever viewed this way
        self._generation = 0

    def hold(self, view: torch.Tensor, tensor_id: str) -> None:
        key = id(view)
        if key in self.live:
            return
        self.target.pin(tensor_id)
        self.live[key] = tensor_id
        self.seen.add(tensor_id)
        weakref.finalize(view, self._drop, key, tensor_id, self._generation)

    def of(self, t: Any) -> str | None:
        """The tensor id `t` is a held view of, if it is one."""
        return self.live.get(id(t)) if self.live else None

    def hold_aliases(self, out: Any, among: Iterable[str] | None = None) -> None:
        """Hold every tensor in `out` (a tensor, or one level of tuple, list or
        dict values) that points into the fast buffer of a cached tensor (of one
        in `among`, when given) and is not a parameter itself."""
        for t in _tensors_in_output(out):
            if isinstance(t, nn.Parameter):
                continue
            found = self.target.owner_of(t)
            if found is not None and (among is None or found[0] in among):
                self.hold(t, found[0])

    def _drop(self, key: int, tensor_id: str, generation: int) -> None:
        if generation != self._generation:  # the step ended: its pins were reset
            return
        self.live.pop(key, None)
        self.target.release(tensor_id)

    def end_step(self) -> list[str]:
        """Forget this step's views (the step's end resets every pin); the tensor
        ids of those still referenced, which would read reused buffers."""
        if self.live:
            gc.collect()  # views kept only by reference cycles
        left = sorted(set(self.live.values()))
        self.live = {}
        self._generation += 1
        return left


def _tensors_in_output(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
        return
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    for o in items:
        if isinstance(o, torch.Tensor):
            yield o


def install_hooks(
    model: nn.Module,
    names: dict[nn.Parameter, str],
    target: HookTarget,
    views: ViewPins | None = None,
) -> list[Any]:
    handles: list[Any] = []
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p in names]
        if not own:
            continue
        ids = [names[p] for p in own]
        handles.append(module.register_forward_pre_hook(_pre(ids, target)))
        handles.append(module.register_forward_hook(_post(ids, target, views)))
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


def _post(ids: list[str], target: HookTarget, views: ViewPins | None) -> Callable[..., None]:
    own = frozenset(ids)

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if in_backward():  # recomputed for a checkpoint: its saved views need these
            return
        if views is not None:  # `return self.weight.T`: the view outlives this forward
            views.hold_aliases(output, own)
        for tid in ids:
            target.release(tid)

    return hook


def _opt(tid: str, target: HookTarget) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        assert isinstance(param, nn.Parameter)
        target.optimizer_step(tid, param)

    return hook


@contextmanager
def saved_tensor_refs(target: HookTarget) -> Iterator[Callable[[torch.Tensor], Any]]:
    """While active, cached tensors saved for backward are kept as references
    (yields the pack hook, which `LooseParams` looks for)."""

    def pack(t: torch.Tensor) -> Any:
        found = target.owner_of(t)
        if found is None:
            placeholder = target.placeholder_of(t)
            if placeholder is not None:
                raise RuntimeError(
                    f"{placeholder} is read while it is not in the fast tier (its "
                    "placeholder): a read outside the forward of its module that the first "
                    "step did not show; set EngineConfig(watch_loose=True)"
                )
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
        yield pack


class LooseParams(TorchFunctionMode):
    """Fetches, and pins for the op, any parameter an op receives while no module
    hook has it pinned; without it such an op would read the parameter's NaN
    placeholder, or a buffer another tensor now owns. A view the op returns
    (of a parameter, or of a view held already) is held by `views` for as
    long as it lives; so is a view property (`.T`, `.mT`, `.H`, `.mH`,
    `.data`), which reads the parameter too."""

    def __init__(
        self,
        names: dict[nn.Parameter, str],
        target: HookTarget,
        views: ViewPins,
        own_pack: Callable[[torch.Tensor], Any],
    ) -> None:
        super().__init__()
        self.names = names
        self.target = target
        self.views = views
        self.own_pack = own_pack  # `saved_tensor_refs`'s pack hook

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _SETTERS:  # `p.data = view`, `p.grad = None`: no read
            return func(*args, **kwargs)
        if name == "__get__":
            return self._property(func, args, kwargs)
        read: list[str] = []  # cached tensors the op reads: parameters, held views
        fetched: list[str] = []
        for a in _tensors_in(args, kwargs):
            if isinstance(a, nn.Parameter):
                tid = self.names.get(a)
                if tid is None:
                    continue
                if not self.target.pinned(tid):
                    self.target.use_loose(tid)
                    fetched.append(tid)
                read.append(tid)
            else:
                tid = self.views.of(a)
                if tid is not None:
                    self._check_view(a, tid)
                    read.append(tid)
        if not read:
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
            self.views.hold_aliases(out, read)
            return out
        finally:
            self._release(fetched)

    def _property(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
        """`p.T` and the like are descriptors; `p.grad`, `p.shape` read nothing. A
        property is a read when what it gives shares the tensor's storage."""
        obj = args[0] if args else None
        tid = self.names.get(obj) if isinstance(obj, nn.Parameter) else self.views.of(obj)
        if tid is not None and isinstance(obj, torch.Tensor) and not isinstance(obj, nn.Parameter):
            self._check_view(obj, tid)
        out = func(*args, **kwargs)
        if tid is None or not _is_view_of(out, obj):
            return out
        fetched = []
        if isinstance(obj, nn.Parameter) and not self.target.pinned(tid):
            self.target.use_loose(tid)  # it read the placeholder: read it again, fetched
            fetched.append(tid)
            out = func(*args, **kwargs)
        try:
            self.views.hold(out, tid)
            return out
        finally:
            self._release(fetched)

    def _check_view(self, view: torch.Tensor, tensor_id: str) -> None:
        """A held view whose tensor left its buffer since (its optimizer step drops
        every pin) points at bytes that are no longer the tensor's."""
        found = self.target.owner_of(view)
        if found is None or found[0] != tensor_id:
            raise RuntimeError(
                f"a view of {tensor_id} is used after {tensor_id} left the fast tier (after "
                "its optimizer step); take views of parameters where they are used"
            )

    def _release(self, fetched: list[str]) -> None:
        if not fetched or self._recomputed_later():
            return  # released at the parameter's optimizer step (or the step's end)
        for tid in fetched:
            self.target.release(tid)

    def _recomputed_later(self) -> bool:
        """Inside a region that backward recomputes (or recomputing it): keep what
        it read pinned until the parameter's optimizer step, as module hooks do.
        This mode is not active in backward (autograd does not carry torch
        function modes into it), so the recomputation reads the parameter
        unwatched: it must still be in its buffer then. A non-reentrant
        checkpoint pushes saved-tensor hooks over ours; a reentrant one runs its
        forward without grad (as does an evaluation step, which then holds the
        parameters it read loosely to the step's end)."""
        if in_backward() or not torch.is_grad_enabled():
            return True
        top = _top_saved_hooks()
        return top is None or top[0] is not self.own_pack


_SETTERS = frozenset({"__set__", "__delete__"})


def _top_saved_hooks() -> tuple[Any, Any] | None:
    """The innermost `saved_tensors_hooks` (pack, unpack) pair, None if none."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return None if top is None else top(False)


def _is_view_of(out: Any, obj: Any) -> bool:
    return (
        isinstance(out, torch.Tensor)
        and out is not obj
        and isinstance(obj, torch.Tensor)
        and out.layout is torch.strided  # a sparse `.grad` has no one storage
        and obj.layout is torch.strided
        and out.untyped_storage().data_ptr() == obj.untyped_storage().data_ptr()
    )


def _tensors_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    """Tensors among the arguments, and one level into lists and tuples
    (`torch.cat([w1, w2])`); deeper nesting is not how ops take weights."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b


def _tensors_of(out: Any) -> Iterator[torch.Tensor]:
    """The tensors in a model's output: a tensor, or tensors in (nested) mappings
    (a Hugging Face `ModelOutput` is one), lists and tuples."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from _tensors_of(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors_of(v)


def graph_params(out: Any) -> Iterator[torch.Tensor]:
    """Every leaf tensor autograd would accumulate a gradient into from the
    outputs `out`: the `variable` of each `AccumulateGrad` node reachable from
    their `grad_fn`s (each node once). A reentrant checkpoint's region is one
    node here (its inside is rebuilt in backward), so its leaves are not seen."""
    seen: set[int] = set()
    stack = [t.grad_fn for t in _tensors_of(out) if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        leaf = getattr(fn, "variable", None)
        if isinstance(leaf, torch.Tensor):
            yield leaf
            continue
        stack.extend(f for f, _i in fn.next_functions if f is not None)
