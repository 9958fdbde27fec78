"""A training state read out of the cache and written back into it, one tensor at a
time (no copy of the model is made): the engine's `snapshot`, `state_dict` and
`load_state_dict`, and the current value of a parameter that `model.state_dict()`
and `close()` give.

Parameters are read in the dtype the model gave them (the fp32 master under mixed
precision); a sliced AdamW state is read whole, under its `state_id`, as it is
without slicing, and cut back into its slices on load. So a checkpoint resumes
bit-exactly under any strategy, budget and slicing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from offload_agent.cache import TensorCache
from offload_agent.optim import (
    GRAD_KIND,
    STATE_KINDS,
    AdamW,
    Optimizer,
    ParamGroup,
    Slices,
    slice_id,
    state_id,
)
from offload_agent.precision import MASTER_KIND, LossScaler
from offload_agent.residency import TensorSpec

__all__ = ["Checkpoint"]


class Checkpoint:
    def __init__(
        self,
        cache: Callable[[], TensorCache],
        params: Mapping[str, nn.Parameter],
        specs: Sequence[TensorSpec],
        masters: Mapping[str, str],
        sliced: Mapping[str, Slices],
        optim: Optimizer,
        scaler: LossScaler | None,
    ) -> None:
        self._cache, self.params, self.specs = cache, params, specs
        self.masters, self.sliced, self.optim, self.scaler = masters, sliced, optim, scaler
        self._dtypes = {n: p.dtype for n, p in params.items()}  # as the model had them
        self._spec = {s.tensor_id: s for s in specs}
        # the cached tensors that are slices of a state (a parameter's own name may
        # hold '@' or '#': the ids are listed, not parsed)
        self._slice_ids = frozenset(
            slice_id(state_id(n, k), i)
            for n, cut in sliced.items()
            for k in STATE_KINDS
            for i in range(cut.count)
        )

    def value(self, name: str) -> torch.Tensor:
        """A parameter's current value in the dtype the model gave it: its fp32
        master under mixed precision (a frozen one: its working copy, converted)."""
        cache = self._cache()
        master = self.masters.get(name)
        if master is not None:
            return cache.materialize(master).to(self._dtypes[name])
        return cache.materialize(name).to(self._dtypes[name])

    def snapshot(self) -> dict[str, torch.Tensor]:
        """CPU copies of every tensor's current value (parameters and states; a
        sliced state whole, under its `state_id`, as it is without slicing)."""
        cache = self._cache()
        cache.drain()
        out = {
            s.tensor_id: cache.materialize(s.tensor_id)
            for s in self.specs
            if s.tensor_id not in self._slice_ids
        }
        for name in self.sliced:
            for k in STATE_KINDS:
                out[state_id(name, k)] = self._state_value(name, k)
        return out

    def _state_value(self, name: str, kind: str) -> torch.Tensor:
        """A CPU copy of one AdamW state of parameter `name`, whole."""
        cache = self._cache()
        sid = state_id(name, kind)
        cut = self.sliced.get(name)
        if cut is None:
            return cache.materialize(sid)
        pieces = [cache.materialize(slice_id(sid, i)) for i in range(cut.count)]
        return cut.join(pieces, tuple(self.params[name].shape))

    def _trained(self, name: str) -> bool:
        """Parameter `name` has optimizer states (it is not frozen)."""
        return name in self.sliced or state_id(name, STATE_KINDS[0]) in self._cache().residency

    def state_dict(self, steps: int) -> dict[str, Any]:
        """Parameters, optimizer states, step counts (`steps`: the engine's) and the
        loss scale, as CPU tensors and numbers read one tensor at a time."""
        cache = self._cache()
        cache.drain()
        trained = [n for n in self.params if self._trained(n)]
        state: dict[str, Any] = {
            "params": {n: self.value(n) for n in self.params},
            "state": {
                n: {
                    "step": self.optim.steps.get(n, 0),
                    **{k: self._state_value(n, k) for k in STATE_KINDS},
                }
                for n in trained
            },
            "groups": [
                {"params": list(g.params), **dataclasses.asdict(g.config)}
                for g in self.optim.groups
            ],
            "steps": steps,
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Put back what `state_dict` gave; returns the engine's step count."""
        cache = self._cache()
        params, states = state["params"], state["state"]
        # tensor id -> (shape, dtype) as the state dict holds it: sliced states whole
        want = {
            s.tensor_id: (s.shape, self._dtypes.get(s.tensor_id, s.dtype))
            for s in self.specs
            if s.kind not in (GRAD_KIND, MASTER_KIND) and s.tensor_id not in self._slice_ids
        }
        for name in self.sliced:
            for k in STATE_KINDS:
                sid = state_id(name, k)
                dtype = self._spec[slice_id(sid, 0)].dtype
                want[sid] = (tuple(self.params[name].shape), dtype)
        got = dict(params)
        got.update({state_id(n, k): st[k] for n, st in states.items() for k in STATE_KINDS})
        if set(got) != set(want):
            diff = sorted(set(got) ^ set(want))
            raise ValueError(f"state dict does not match the model: {diff[:3]} ({len(diff)})")
        for tid, value in got.items():
            shape, dtype = want[tid]
            if tuple(value.shape) != shape or value.dtype != dtype:
                raise ValueError(
                    f"state dict: {tid} is {tuple(value.shape)} {value.dtype}, "
                    f"the model has {shape} {dtype}"
                )
        cache.drain()
        sliced_states_by_id = {
            state_id(n, k): cut for n, cut in self.sliced.items() for k in STATE_KINDS
        }
        for tid, value in got.items():
            master = self.masters.get(tid)
            if master is not None:
                cache.overwrite(master, value.to(torch.float32))
            cut = sliced_states_by_id.get(tid)
            if cut is not None:
                for i, piece in enumerate(cut.split(value)):
                    cache.overwrite(slice_id(tid, i), piece)
                continue
            cache.overwrite(tid, value.to(self._spec[tid].dtype))
        self.optim.steps = {n: int(st["step"]) for n, st in states.items() if st["step"]}
        self.optim.groups = [
            ParamGroup(
                tuple(g["params"]),
                AdamW(g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"]),
            )
            for g in state["groups"]
        ]
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        return int(state["steps"])
