"""Parameters read outside the forward of a module that owns them (an
`nn.ParameterDict` used by its parent, `F.linear(x, self.tok.weight)`), through
every kind of access: ops, view properties (`.T`, `.mT`, `.H`, `.mH`, `.data`),
views (`p[0]`, `p.view`, `p.expand`, `p.detach()`, views of views) used after
other modules have run, a module returning a view of its own parameter, and
the same inside activation-checkpointed regions. Each trains to exactly the
numbers of `torch.optim.AdamW` under every strategy, or is refused with an
error naming the parameter; none trains on a placeholder or a reused buffer."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.nvme import NvmeStore
from offload_agent.optim import AdamW
from shared.offload.planner import build_plan
from tests.offload_agent.hf import DEVICE, engine_device, exact

D = 64  # every parameter is D x D: 16 KiB, one size class
FAST = 4 * D * D * 4  # four buffers: every step refills them many times
STEPS = 3


class Child(nn.Module):
    """Returns a view of its own parameter (a learned query, a positional table)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, D) / 8)

    def forward(self) -> torch.Tensor:
        return self.weight.T


class Net(nn.Module):
    def __init__(self, read: Callable[[Net, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.p = nn.ParameterDict({k: nn.Parameter(torch.randn(D, D) / 8) for k in ("w", "v")})
        self.lin = nn.Linear(D, D, bias=False)
        self.lins = nn.ModuleList(nn.Linear(D, D, bias=False) for _ in range(4))
        self.child = Child()
        self.read = read
        self.calls = 0

    def chain(self, h: torch.Tensor) -> torch.Tensor:
        """Four modules: their fetches would refill a buffer under a stale view."""
        for lin in self.lins:
            h = lin(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.read(self, x).square().mean()


def _delayed_T(m: Net, x: torch.Tensor) -> torch.Tensor:
    vt = m.p["v"].T
    return m.chain(m.lin(x @ m.p["w"])) @ vt


def _delayed_view(m: Net, x: torch.Tensor) -> torch.Tensor:
    v = m.p["v"].view(D, D)[:, :]  # a view of a view
    return m.chain(m.lin(x @ m.p["w"])) @ v


def _escaped(m: Net, x: torch.Tensor) -> torch.Tensor:
    e = m.child()
    return m.chain(m.lin(x @ m.p["w"])) @ e @ m.p["v"]


def _ckpt(reentrant: bool) -> Callable[[Net, torch.Tensor], torch.Tensor]:
    def read(m: Net, x: torch.Tensor) -> torch.Tensor:
        h = m.lin(x @ m.p["w"])
        out = checkpoint(lambda h: m.chain(h @ m.p["v"].T), h, use_reentrant=reentrant)
        assert isinstance(out, torch.Tensor)
        return out

    return read


READS: dict[str, Callable[[Net, torch.Tensor], torch.Tensor]] = {
    "T": lambda m, x: x @ m.p["w"] @ m.p["v"].T,
    "mT": lambda m, x: x @ m.p["w"] @ m.p["v"].mT,
    "H": lambda m, x: x @ m.p["w"] @ m.p["v"].H,
    "mH": lambda m, x: x @ m.p["w"] @ m.p["v"].mH,
    "t()": lambda m, x: x @ m.p["w"] @ m.p["v"].t(),
    "F.linear": lambda m, x: F.linear(x @ m.p["w"], m.p["v"]),
    "p[0]": lambda m, x: (x @ m.p["w"]) * m.p["v"][0],
    "view": lambda m, x: x @ m.p["w"] @ m.p["v"].view(D, D),
    "expand": lambda m, x: (x @ m.p["w"]) * m.p["v"][:1].expand(x.shape[0], D),
    "cat": lambda m, x: x @ torch.cat([m.p["w"], m.p["v"]], 1)[:, :D],
    ".data": lambda m, x: x @ m.p["w"] @ m.p["v"].data.T,
    "detach()": lambda m, x: x @ m.p["w"] @ m.p["v"].detach(),
    "chunk": lambda m, x: x @ m.p["w"] @ torch.cat(m.p["v"].chunk(2, 0)[::-1], 0),
    ".T[...]": lambda m, x: (x @ m.p["w"])[:, :32] @ m.p["v"].T[:32, :],
    ".T used later": _delayed_T,
    "view of a view used later": _delayed_view,
    "a module returns a view of its parameter": _escaped,
    "checkpointed (non-reentrant)": _ckpt(False),
    "checkpointed (reentrant)": _ckpt(True),
}


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, D, generator=g).to(DEVICE) for _ in range(STEPS)]


def _reference(read: Callable[[Net, torch.Tensor], torch.Tensor]) -> tuple[list[float], Net, Any]:
    model = Net(read).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    losses = []
    for x in _inputs():
        opt.zero_grad()
        loss = model(x)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model, opt


def _engine(read: Callable[[Net, torch.Tensor], torch.Tensor], strategy: str, root: Path,
            io: ThreadPoolExecutor, **config: Any) -> OffloadEngine:  # fmt: skip
    engine = OffloadEngine(
        Net(read),
        AdamW(lr=1e-2),
        EngineConfig(
            job_id=strategy, strategy=strategy, fast_budget=FAST, host_budget=16 * FAST, **config
        ),
        device=engine_device(),
        store=NvmeStore(root / strategy),
        io=io,
    )
    engine.start()
    return engine


def _train(engine: OffloadEngine) -> list[float]:
    losses = []
    for x in _inputs():
        with engine.step():
            loss = engine.model(x)
            loss.backward()
        losses.append(float(loss.detach()))
        if engine.profile_ready:
            assert engine.apply_plan(build_plan(engine.profile(), engine.budgets))
    return losses


def _assert_as_torch(engine: OffloadEngine, model: Net, opt: Any) -> None:
    state = engine.state_dict()
    for name, p in model.named_parameters():
        exact(state["params"][name], p.detach(), name)
        ref = opt.state.get(p, {})  # a parameter no step reads has no state
        assert state["state"][name]["step"] == int(ref.get("step", 0)), name
        for k in ("exp_avg", "exp_avg_sq"):
            exact(state["state"][name][k], ref.get(k, torch.zeros_like(p)), f"{name} {k}")


@pytest.mark.parametrize("how", list(READS))
def test_loose_reads_train_as_torch_adamw(how: str, tmp_path: Path, io: ThreadPoolExecutor) -> None:
    want, model, opt = _reference(READS[how])
    for strategy in ("lru", "fixed", "tencache"):
        engine = _engine(READS[how], strategy, tmp_path, io)
        try:
            assert _train(engine) == want, strategy
            _assert_as_torch(engine, model, opt)
        finally:
            engine.close()


def _from_third_call(m: Net, x: torch.Tensor, first: bool) -> torch.Tensor:
    """Reads `p.v` loosely only from the third step on: the first step, which
    decides whether every later step is watched, does not show it."""
    if m.calls < 3:
        return m.chain(m.lin(x))
    return m.chain(x @ m.p["v"]) if first else m.chain(m.lin(x)) @ m.p["v"]


@pytest.mark.parametrize(
    ("first", "error"),
    [(False, r"p\.v is read while it is not in the fast tier"),
     (True, r"p\.v will get a gradient but was not fetched in this step")],
)  # fmt: skip
def test_a_loose_read_the_first_step_did_not_show_is_refused(
    first: bool, error: str, tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """Refused in the forward of the step that reads the placeholder, before any
    parameter steps: when autograd saves it, else (`x @ p` with no gradient for
    `x` saves only `x`) at the end of the model's forward, from the graph of
    its output (before, it was refused only when `p.v`'s gradient arrived,
    after every parameter later in the forward had stepped a third time)."""

    def read(m: Net, x: torch.Tensor) -> torch.Tensor:
        return _from_third_call(m, x, first)

    want, model, opt = _reference(read)
    for strategy in ("lru", "tencache"):
        engine = _engine(read, strategy, tmp_path / "off", io)
        with pytest.raises(RuntimeError, match=error):
            _train(engine)
        assert engine.steps == 3  # refused in the third step
        counts = {n: s["step"] for n, s in engine.state_dict()["state"].items()}
        assert max(counts.values()) == 2, counts  # nothing stepped in it
        engine.close()
        watched = _engine(read, strategy, tmp_path / "on", io, watch_loose=True)
        assert _train(watched) == want
        _assert_as_torch(watched, model, opt)
        watched.close()


def test_a_view_kept_across_steps_is_refused(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    """A module that caches `p.T` would read a reused buffer in the next step."""

    def read(m: Net, x: torch.Tensor) -> torch.Tensor:
        m.cached = m.p["v"].T
        return x @ m.p["w"] @ m.cached

    engine = _engine(read, "lru", tmp_path, io)
    with pytest.raises(RuntimeError, match=r"a view of p\.v .* still referenced after the step"):
        _train(engine)
    engine.close()


def test_a_view_used_after_its_parameter_stepped_is_refused(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """`vt = p.T` before backward, read after it: the optimizer step moved the
    parameter out of the buffer the view points into."""
    engine = _engine(READS["T"], "lru", tmp_path, io)
    model = engine.model
    assert isinstance(model, Net)
    x = _inputs()[0]
    error = r"a view of p\.v is used after p\.v left the fast"
    with pytest.raises(RuntimeError, match=error), engine.step():
        vt = model.p["v"].T
        model(x).backward()
        for lin in model.lins:  # other tensors take the buffers
            lin(x)
        vt.sum()
    engine.close()


def test_a_loose_read_in_an_evaluation_step_reads_the_parameter(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """An evaluation step (gradients off: no graph to walk at the end of the
    forward) that reads a parameter loosely in a way the training steps before
    it did not show, through an op that saves nothing: it computed with the NaN
    placeholder, silently. A step that begins with gradients off is watched,
    so it reads the real value, and so is every step after one that found a
    loose read (the next training step reads it too)."""

    def read(m: Net, x: torch.Tensor) -> torch.Tensor:
        return _from_third_call(m, x, True)

    xs = _inputs()
    model = Net(read).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    want: list[float] = []
    for k in (0, 1, None, 2):  # two training steps, an evaluation, a training step
        if k is None:
            with torch.no_grad():
                want.append(float(model(xs[2])))
            continue
        opt.zero_grad()
        loss = model(xs[k])
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    for strategy in ("lru", "tencache"):
        engine = _engine(read, strategy, tmp_path / strategy, io)
        got: list[float] = []
        for k in (0, 1, None, 2):
            if k is None:
                with torch.no_grad(), engine.step():
                    got.append(float(engine.model(xs[2])))
                assert engine.loose == {"p.v"}, strategy
                continue
            with engine.step():
                loss = engine.model(xs[k])
                loss.backward()
            got.append(float(loss.detach()))
            if engine.profile_ready:
                assert engine.apply_plan(build_plan(engine.profile(), engine.budgets))
        assert got == want, strategy
        _assert_as_torch(engine, model, opt)
        engine.close()
