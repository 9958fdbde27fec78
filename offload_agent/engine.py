"""`OffloadEngine`: 10Cache inside one training process.

    engine = OffloadEngine(model, AdamW(lr=3e-4), EngineConfig(...),
                           device=select_device(), store=NvmeStore(dir), io=pool)
    engine.start()                      # buffers and swap files, safe-default layout
    for batch in data:
        engine.set_lr(schedule(engine.steps))   # optional: a learning-rate schedule
        with engine.step():             # the first step is the warm-up: it is recorded
            engine.scale(model(batch)).backward()   # optimizer runs inside backward
        if engine.profile_ready:        # after warm-up: plan locally or via the agent
            engine.apply_plan(build_plan(engine.profile(), engine.budgets))
    torch.save(engine.state_dict(), path)   # parameters, optimizer states, step counts

Every use of the model's parameters (forward, backward, evaluation under
`torch.no_grad()`) goes inside `with engine.step():`; outside it the
parameters are placeholders and any use raises. With `max_grad_norm` set, or
`accumulation_steps` > 1, gradients are kept (cached like the optimizer
states) until the step's end; the global norm is computed over all of them
before any parameter steps, as DeepSpeed does (`gradients.py`). With
`precision="bf16"` or `"fp16"` the model computes with working copies in
that dtype over fp32 masters and states (`precision.py`); fp16 keeps every
gradient to the step's end for GradScaler's overflow check and skip.

A plan that does not fit (other job, over budget, NVMe unusable) is refused
with a clear message in `last_error` and a log line; training carries on with
the layout it had (the safe default: `lru`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from offload_agent.access import HookAccess
from offload_agent.cache import TensorCache
from offload_agent.checkpoint import Checkpoint
from offload_agent.device import Device
from offload_agent.gradients import GradientSteps
from offload_agent.hooks import (
    LooseParams,
    ViewPins,
    graph_params,
    install_hooks,
    saved_tensor_refs,
)
from offload_agent.layout import ParamBinder, build_cache
from offload_agent.nvme import NvmeStore, SwapPathError
from offload_agent.optim import AdamW, Optimizer, ParamGroup
from offload_agent.precision import MASTER_KIND, PRECISIONS, LossScale, LossScaler
from offload_agent.profiler import Recorder
from offload_agent.residency import TensorSpec
from offload_agent.stats import CacheStats
from offload_agent.strategies import (
    STRATEGIES,
    Setup,
    from_plan,
    initial_setup,
    sliced_states,
    specs_of,
)
from shared.messages import OffloadStats, PrefetchPlan, TensorProfile
from shared.offload.planner import Budgets, PlanError, check_plan

__all__ = ["EngineConfig", "OffloadEngine"]

log = logging.getLogger("rltune.offload")

SLICE_MIN_BYTES = 1 << 20  # the smallest default state slice


@dataclass(frozen=True, slots=True)
class EngineConfig:
    job_id: str = "local"
    strategy: str = "tencache"  # none | lru | fixed | tencache
    fast_budget: int = 1 << 30
    host_budget: int = 1 << 30
    fixed_window: int = 4  # `fixed`: parameters prefetched ahead in layer order
    node_id: str = ""
    # backward passes (micro-batches) per optimizer step; gradients are summed
    # as PyTorch sums them in `.grad` (scale the loss yourself, as with PyTorch)
    accumulation_steps: int = 1
    # clip the gradients to this global 2-norm (torch.nn.utils.clip_grad_norm_)
    max_grad_norm: float | None = None
    # fp32 | bf16 | fp16: the dtype the model computes with (bf16/fp16: fp32
    # master weights and states in the slow tiers, working copies in the fast one)
    precision: str = "fp32"
    loss_scale: LossScale = dataclasses.field(default_factory=LossScale)  # fp16 only
    # AdamW states of a parameter of more than `slice_above` bytes (default: an
    # eighth of the fast budget, i.e. a step that would hold 3/8 of it) are cut
    # into slices of about `slice_bytes` (default: max(1 MiB, fast budget / 64))
    # that stream through the cache one at a time (`optim.Slices`). None: on for
    # `tencache` only (its plan sizes buffers for them; `lru` and `fixed` stand
    # for whole-tensor offload); True / False: on / off for any strategy.
    slice_states: bool | None = None
    slice_bytes: int | None = None
    slice_above: int | None = None
    # tencache: write a changed tensor home as soon as it is released when its
    # next use lies beyond the lookahead (write-behind), instead of when its
    # buffer is next taken. Off by default: side by side it was slower in 10
    # of 12 comparisons on the CPU stand-in and on the H100's large GPT and BERT
    # (docs/results/offload-engine-experiments.md, "Sliced optimizer states").
    write_behind: bool = False
    # tencache's run-time lead in bytes: past its `window` tensors, the cache
    # keeps fetching ahead (buffers permitting) until this many bytes are
    # fetched and not yet used. Default: an eighth of the fast budget. Counting
    # tensors alone, many small ones (ResNet's BatchNorm parameters and states,
    # state slices) used up the lead in a few hundred KB.
    lead_bytes: int | None = None
    # watch every op for parameters read outside their modules' forward
    # (`LooseParams`): None: the first step looks, later training steps only if
    # a step found any (the watch costs a few percent of a small model's step),
    # evaluation steps (gradients off as the step begins) always; True: always
    # (a model that reads a parameter loosely only on some later training step).
    watch_loose: bool | None = None

    def prefetch_lead_bytes(self) -> int:
        return self.fast_budget // 8 if self.lead_bytes is None else self.lead_bytes

    def state_slicing(self) -> tuple[int, int] | None:
        """(slice bytes, parameter bytes above which states are sliced), or None."""
        on = self.strategy == "tencache" if self.slice_states is None else self.slice_states
        if not on:
            return None
        size = self.slice_bytes or max(SLICE_MIN_BYTES, self.fast_budget // 64)
        return size, self.fast_budget // 8 if self.slice_above is None else self.slice_above


class OffloadEngine:
    def __init__(
        self,
        model: nn.Module,
        optim: AdamW | Sequence[ParamGroup],
        config: EngineConfig,
        *,
        device: Device,
        store: NvmeStore | None,
        io: Executor,
    ) -> None:
        if config.strategy not in STRATEGIES:
            raise ValueError(f"strategy {config.strategy!r}: choose from {', '.join(STRATEGIES)}")
        if config.accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, not {config.accumulation_steps}")
        if config.max_grad_norm is not None and not config.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, not {config.max_grad_norm}")
        if config.precision not in PRECISIONS:
            raise ValueError(f"precision {config.precision!r}: choose from {', '.join(PRECISIONS)}")
        self.model, self.config = model, config
        self.device, self.store, self.io = device, store, io
        self.budgets = Budgets(config.fast_budget, config.host_budget)
        self.stats = CacheStats()
        self.recorder = Recorder()
        self.names = {p: n for n, p in model.named_parameters()}
        self.params = {n: p for p, n in self.names.items()}
        # every name a parameter has in `model.state_dict()` (tied ones have two)
        self.aliases = {n: self.names[p] for n, p in model.named_parameters(remove_duplicate=False)}
        self.optim = Optimizer(list(self.params), optim)
        self.working = PRECISIONS[config.precision]
        self.scaler = (
            LossScaler(config.loss_scale, device.fast_device)
            if config.precision == "fp16"
            else None
        )
        keep = (
            config.accumulation_steps > 1
            or config.max_grad_norm is not None
            or self.scaler is not None
        )
        slicing = config.state_slicing()
        # parameter -> how its AdamW states are sliced (very large parameters only)
        self.sliced = (
            sliced_states(model, slice_bytes=slicing[0], above=slicing[1]) if slicing else {}
        )
        self.specs = specs_of(model, accumulate=keep, working=self.working, sliced=self.sliced)
        self.masters = {  # parameter -> its fp32 master copy (mixed precision)
            s.tensor_id.removesuffix(f"#{MASTER_KIND}"): s.tensor_id
            for s in self.specs
            if s.kind == MASTER_KIND
        }
        # what the hooks call (use, release, pin, a complete gradient)
        self.access = HookAccess(
            self._cache,
            self.recorder,
            device.fast_device,
            gradient=lambda tensor_id, grad: self.grads.on_gradient(tensor_id, grad),
        )
        self.loose = self.access.loose  # parameters read outside their modules' forward
        self.grads = GradientSteps(
            self.optim,
            order=list(self.params),
            masters=self.masters,
            scaler=self.scaler,
            accumulation_steps=config.accumulation_steps,
            max_grad_norm=config.max_grad_norm,
            use=self.access.use,
            cache=self._cache,
            sliced=self.sliced,
        )
        self.cache: TensorCache | None = None
        self.setup_name = ""
        self.last_error = ""
        self.steps = 0
        self._profile: TensorProfile | None = None
        self._store_ok = False
        self._store_error = ""
        self._refused = False  # a plan for this profile was refused
        self._handles: list[object] = []
        self._binder = ParamBinder(self.params)
        self._watch_loose = config.watch_loose is not False  # the first step looks
        self.views = ViewPins(self.access)  # views of cached tensors, pinned while they live
        # reading and writing the training state (snapshot, state_dict, load_state_dict)
        self.checkpoint = Checkpoint(
            self._cache, self.params, self.specs, self.masters, self.sliced, self.optim,
            self.scaler,
        )  # fmt: skip
        # module buffers (BatchNorm statistics, position ids) as the model had them,
        # to give back at close: while the engine runs they live in the fast tier
        self._buffer_homes: list[tuple[nn.Module, str, torch.device]] = []

    # ---- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Allocate buffers, write swap files, install hooks (safe default layout)."""
        self._store_ok = self._prepare_store()
        self._binder.make_placeholders(
            self.device.fast_device, {s.tensor_id: s.dtype for s in self.specs if s.kind == "param"}
        )
        setup = initial_setup(self.config, self.specs, self.budgets, store_ok=self._store_ok)
        try:
            self._install(setup, (self._initial(spec) for spec in self.specs))
        except BaseException:
            if self.store is not None:
                self.store.remove_all()  # no partial swap files left behind
            raise
        self._move_buffers()
        self.access.placeholders = {
            t.untyped_storage().data_ptr(): n for n, t in self._binder.placeholders.items()
        }
        self._handles = install_hooks(self.model, self.names, self.access, self.views)
        self._handles.append(self.model.register_forward_hook(self._check_graph))
        self._handles.append(
            self.model.register_state_dict_post_hook(
                functools.partial(OffloadEngine._real_values, self)
            )
        )

    def _check_graph(self, module: nn.Module, args: Any, output: Any) -> None:
        """The model's forward is over: with the watch off, a parameter the graph
        of its output will hand a gradient to, but that this step never fetched,
        was read as its NaN placeholder (a loose read the first step did not
        show, through an op that saved nothing). Refused now, before backward
        steps any parameter; without this, only when its gradient arrived,
        after the parameters later in the forward had stepped."""
        if self._watch_loose or not self.access.in_step or not torch.is_grad_enabled():
            return
        for leaf in graph_params(output):
            name = self.names.get(leaf)  # type: ignore[call-overload]
            if name is not None and name not in self.access.fetched:
                raise RuntimeError(
                    f"{name} will get a gradient but was not fetched in this step: the "
                    "forward read its placeholder, outside the forward of its module, in a "
                    "way the first step did not show (nothing has stepped); set "
                    "EngineConfig(watch_loose=True)"
                )

    def _move_buffers(self) -> None:
        """Put every module buffer in the fast tier, where the model computes: they
        are not offloaded (small, and updated in place by the forward, e.g.
        BatchNorm's running statistics). A buffer two modules share stays shared."""
        fast = self.device.fast_device
        moved: dict[int, torch.Tensor] = {}
        for module in self.model.modules():
            for name, buf in module._buffers.items():
                if buf is None or buf.device == fast:
                    continue
                self._buffer_homes.append((module, name, buf.device))
                module._buffers[name] = moved.setdefault(id(buf), buf.to(fast))

    def _restore_buffers(self) -> None:
        moved: dict[int, torch.Tensor] = {}
        for module, name, home in self._buffer_homes:
            buf = module._buffers[name]
            if buf is not None:
                module._buffers[name] = moved.setdefault(id(buf), buf.to(home))
        self._buffer_homes = []

    def _initial(self, spec: TensorSpec) -> tuple[TensorSpec, torch.Tensor]:
        """A tensor's starting value: the parameter as the model holds it (read
        before the parameter is pointed at its buffer, one at a time, so no
        copy of the model is made), zeros for optimizer states."""
        if spec.kind == "param":
            return spec, self.params[spec.tensor_id].detach()
        if spec.kind == MASTER_KIND:  # listed before its parameter: still the model's value
            return spec, self.params[spec.tensor_id.removesuffix(f"#{MASTER_KIND}")].detach()
        return spec, torch.zeros(spec.shape, dtype=spec.dtype)

    def _real_values(
        self, module: nn.Module, state: dict[str, Any], prefix: str, _meta: Any
    ) -> None:
        """`model.state_dict()` while the engine runs: each parameter's current value
        (its module holds a placeholder while the tensor is not in the fast tier)."""
        if self.cache is None:
            return
        self.cache.drain()
        for key in state:
            tid = self.aliases.get(key.removeprefix(prefix))
            if tid is not None:
                state[key] = self.checkpoint.value(tid)

    def close(self, *, restore: bool = True) -> None:
        """Wait for copies in flight, remove the hooks and (by default) give every
        parameter back as an ordinary host tensor holding its trained value. I/O
        errors already raised to training (a bad swap file) are only logged here."""
        for h in self._handles:
            h.remove()  # type: ignore[attr-defined]
        self._handles = []
        if self.cache is None:
            return
        try:
            self.cache.drain()
            if restore:
                for name, param in self.params.items():
                    param.data = self.checkpoint.value(name)
                self._restore_buffers()
        except Exception as exc:  # shutting down: report and go on
            log.warning("offload engine closed with an I/O error: %s", exc)

    def _prepare_store(self) -> bool:
        if self.store is None:
            return False
        try:
            self.store.prepare(job_id=self.config.job_id)
            return True
        except SwapPathError as exc:
            self.last_error = self._store_error = str(exc)
            log.error("%s; continuing without the NVMe tier (host memory over budget)", exc)
            return False

    def _install(self, setup: Setup, values: Iterable[tuple[TensorSpec, torch.Tensor]]) -> None:
        """Build `setup`'s buffers and put every tensor in them, in spec order."""
        if setup.uses_nvme and not self._store_ok:
            raise SwapPathError(
                f"{setup.name} places tensors on NVMe but the NVMe tier is unusable"
            )
        cache = build_cache(
            setup,
            self.budgets,
            device=self.device,
            store=self.store if self._store_ok else None,
            io=self.io,
            stats=self.stats,
            bind=self._binder,
        )
        cache.install(values, setup.homes, setup.fast_class)
        self.cache, self.setup_name = cache, setup.name

    # ---- a training step ---------------------------------------------------

    @contextmanager
    def step(self) -> Iterator[None]:
        """One training step: forward and backward (with the optimizer) inside."""
        cache = self._cache()
        access = self.access
        if access.in_step:
            raise RuntimeError("engine.step() is already active: steps do not nest")
        self.steps += 1
        warmup = self._profile is None and self.config.strategy == "tencache"
        if warmup:
            self.recorder.start()
        t0 = time.perf_counter()
        self.grads.begin()
        access.fetched.clear()
        access.in_step = True
        try:
            with ExitStack() as stack:
                pack = stack.enter_context(saved_tensor_refs(access))
                # An evaluation step (gradients off as it begins) is watched too:
                # with no graph, a loose read the first step did not show could
                # not be refused at the end of the forward and would read the
                # NaN placeholder silently; watched, it reads the parameter.
                if self._watch_loose or not torch.is_grad_enabled():
                    stack.enter_context(LooseParams(self.names, access, self.views, pack))
                cache.begin_step()
                yield
                self.grads.finish(self.steps)
        finally:
            access.in_step = False
            for entry in cache.residency:
                entry.pins = 0
            kept = self.views.end_step()
        if kept:
            raise RuntimeError(
                f"a view of {kept[0]} (p.T, p[0], p.view(...), ... taken outside the forward "
                "of its module, or returned by it) is still referenced after the step: the "
                "fast buffer it points into is reused from here on; do not keep views of "
                "parameters across steps"
            )
        warmup = warmup and bool(self.grads.stepped)  # an evaluation step records nothing
        # Watching every op costs ~7% of a small model's CPU step; a model that
        # read no parameter loosely in its first step does not pay it again.
        if self.config.watch_loose is None:
            self._watch_loose = bool(self.loose or self.views.seen)
        self.device.synchronize()
        self.stats.step_ms.append((time.perf_counter() - t0) * 1e3)
        self.stats.memory(cache.fast.allocated_bytes, cache.host.allocated_bytes)
        if warmup:
            self.recorder.stop()
            self._profile = self.recorder.profile(
                self.config.job_id,
                self.specs,
                fast_budget=self.budgets.fast,
                host_budget=self.budgets.host,
                node_id=self.config.node_id,
            )

    # ---- the optimizer's settings and figures ---------------------------------

    @property
    def last_grad_norm(self) -> float | None:
        """The global gradient norm of the last step, before clipping (clipping only)."""
        return self.grads.last_grad_norm

    @property
    def skipped_steps(self) -> int:
        """fp16 steps skipped on an inf/NaN gradient."""
        return self.grads.skipped_steps

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call `backward()` on: multiplied by the loss scale under
        fp16 (as `GradScaler.scale`), the loss itself otherwise."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    @property
    def loss_scale(self) -> float:
        """The current fp16 loss scale (1.0 without one)."""
        return self.scaler.value if self.scaler is not None else 1.0

    def set_lr(self, lr: float | Sequence[float]) -> None:
        """The learning rate for the next steps: one for every parameter group, or
        one per group (what a scheduler sets)."""
        self.optim.set_lr(lr)

    def _cache(self) -> TensorCache:
        if self.cache is None:
            raise RuntimeError("OffloadEngine.start() has not been called")
        return self.cache

    # ---- profile, plan, stats ----------------------------------------------

    @property
    def profile_ready(self) -> bool:
        return self._profile is not None and self.setup_name != "tencache" and not self._refused

    def profile(self) -> TensorProfile:
        if self._profile is None:
            raise RuntimeError("no profile yet: run one warm-up step first")
        return self._profile

    def apply_plan(self, plan: PrefetchPlan) -> bool:
        """Switch to `plan`; on any problem keep training on what runs now."""
        try:
            check_plan(plan, self.profile(), self.budgets)
            setup = from_plan(
                plan,
                self.specs,
                write_behind=self.config.write_behind,
                lead_bytes=self.config.prefetch_lead_bytes(),
            )
            if setup.uses_nvme and not self._store_ok:
                raise PlanError(
                    f"plan for {plan.job_id} puts tensors on NVMe but the NVMe tier is unusable "
                    f"({self._store_error or 'no store configured'})"
                )
        except (PlanError, RuntimeError) as exc:
            self.last_error = str(exc)
            self._refused = True  # `profile_ready` turns False: no re-plan every step
            log.error("plan refused: %s; continuing on %s", exc, self.setup_name)
            return False
        old = self._cache()
        old.drain()
        if self.store is not None:
            self.store.version = plan.version
        # one tensor at a time from the old buffers into the new: no copy of the model
        self._install(setup, ((s, old.materialize(s.tensor_id)) for s in self.specs))
        return True

    # ---- checkpoints (checkpoint.py) -----------------------------------------

    def snapshot(self) -> dict[str, torch.Tensor]:
        """CPU copies of every tensor's current value (parameters and states; a
        sliced state whole, under its `state_id`, as it is without slicing)."""
        return self.checkpoint.snapshot()

    def state_dict(self) -> dict[str, Any]:
        """Parameters (in the dtype the model gave them: the fp32 masters under
        mixed precision), optimizer states, step counts and the loss scale, as
        CPU tensors and numbers read one tensor at a time (`torch.save` it;
        `load_state_dict` resumes bit-exactly, under any strategy and budget)."""
        return self.checkpoint.state_dict(self.steps)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what `state_dict` gave (after `start()`, between steps). A
        checkpoint of fp32 training loads into a mixed-precision engine and back:
        parameters are stored in the model's own dtype either way."""
        self._cache()
        if self.access.in_step:
            raise RuntimeError("load_state_dict inside `with engine.step():`")
        self.steps = self.checkpoint.load_state_dict(state)

    def stats_message(self) -> OffloadStats:
        """What this process measured, as published on `offload.stats`."""
        return self.stats.to_message(
            self.config.job_id,
            self.config.node_id,
            fast_budget=self.budgets.fast,
            host_budget=self.budgets.host,
        )
