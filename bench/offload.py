"""`rltune bench offload [--json OUT]`: 10Cache against no offload, naive LRU
offload and ZeRO-Infinity-style fixed buffers, on one GPT, side by side.

Every strategy trains the same GPT from the same seed on the same batches
with the same per-parameter AdamW. Its parameters plus AdamW states exceed
the fast-tier budget; the host budget is smaller still, so tensors (params
included) spill to swap files on the real disk (O_DIRECT when it allows).
Steps are interleaved round-robin across the four engines so that load from
other processes hits all of them alike; each step's time includes waiting for
every copy it started (nothing is left running into the next one). Torch
computes on one thread; the other core is the I/O side (what a GPU's copy
engines are), as the fast tier here is host memory (no CUDA).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from offload_agent.device import CpuDevice
from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.gpt import GPT, GPTConfig, batch
from offload_agent.nvme import NvmeStore
from offload_agent.optim import AdamW
from offload_agent.residency import Tier
from offload_agent.stats import percentile
from offload_agent.strategies import STRATEGIES
from services.profiler.planner import build_plan
from shared.cli.common import write_json
from shared.errors import UserError

__all__ = ["main"]


@dataclass(frozen=True)
class BenchArgs:
    layers: int = 4
    dim: int = 512
    vocab: int = 2048
    seq: int = 64
    batch: int = 4
    steps: int = 8  # measured steps per strategy
    warmup: int = 2  # first: recorded profile (tencache plans after it)
    fast_frac: float = 0.75  # fast budget as a fraction of parameter bytes
    host_frac: float = 0.2  # host budget as a fraction of parameter bytes
    window: int = 8  # most streamed tensors the plan prefetches ahead
    stream_share: float = 0.9  # most of the fast budget the plan's streaming buffers take
    io_threads: int = 4  # they mostly wait on the disk: 4 keep it busy (1, 2 were slower)
    seed: int = 0
    nvme_dir: str | None = None
    json: str | None = None


def _parse(argv: list[str]) -> BenchArgs:
    p = argparse.ArgumentParser(prog="rltune bench offload", description=__doc__)
    for field, default in asdict(BenchArgs()).items():
        kind = type(default) if default is not None else str
        p.add_argument("--" + field.replace("_", "-"), type=kind, default=default)
    a = BenchArgs(**vars(p.parse_args(argv)))
    if a.steps < 1 or a.warmup < 1 or a.dim % 8 or a.fast_frac <= 0:
        raise UserError("need --steps >= 1, --warmup >= 1, --dim a multiple of 8, --fast-frac > 0")
    return a


def _engine(a: BenchArgs, strategy: str, root: Path, io: ThreadPoolExecutor) -> OffloadEngine:
    torch.manual_seed(a.seed)
    model = GPT(GPTConfig(vocab=a.vocab, seq=a.seq, layers=a.layers, dim=a.dim, heads=8))
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    config = EngineConfig(
        job_id=f"bench-{strategy}",
        strategy=strategy,
        fast_budget=int(pbytes * a.fast_frac),
        host_budget=int(pbytes * a.host_frac),
    )
    engine = OffloadEngine(
        model, AdamW(lr=3e-4), config, device=CpuDevice(), store=NvmeStore(root / strategy), io=io
    )
    engine.start()
    return engine


def _step(engine: OffloadEngine, a: BenchArgs, step: int) -> tuple[float, float, float]:
    """One training step; (loss, wall ms including every copy it started, process
    CPU ms over that time: compute plus the I/O threads' own work)."""
    model = engine.model
    assert isinstance(model, GPT)
    gcfg = model.cfg
    x, y = batch(gcfg, a.batch, step, a.seed)
    t0, c0 = time.perf_counter(), time.process_time()
    with engine.step():
        loss = engine.model(x, y)
        loss.backward()
    assert engine.cache is not None
    engine.cache.drain()
    ms = (time.perf_counter() - t0) * 1e3
    cpu = (time.process_time() - c0) * 1e3
    ready = engine.config.strategy == "tencache" and engine.profile_ready
    if ready and not engine.apply_plan(
        build_plan(engine.profile(), engine.budgets, window=a.window, stream_share=a.stream_share)
    ):
        raise RuntimeError(f"plan refused: {engine.last_error}")
    return float(loss.item()), ms, cpu


def _run(a: BenchArgs, root: Path, console: Console) -> dict[str, dict[str, Any]]:
    """Per strategy its summary; under "profile", tencache's recorded warm-up profile
    (what the simulator's offload cost model predicts step times from)."""
    out: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(a.io_threads, thread_name_prefix="offload-io") as io:
        engines = {s: _engine(a, s, root, io) for s in STRATEGIES}
        losses: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        times: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        cpus: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        total = (a.warmup + a.steps) * len(engines)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("training (round-robin over strategies)", total=total)
            for step in range(a.warmup + a.steps):
                for s, engine in engines.items():
                    if step == a.warmup:
                        engine.stats.reset()
                    loss, ms, cpu = _step(engine, a, step)
                    losses[s].append(loss)
                    if step >= a.warmup:
                        times[s].append(ms)
                        cpus[s].append(cpu)
                    progress.advance(task)
        for s, engine in engines.items():
            out[s] = _summary(engine, times[s], losses[s], a.steps)
            out[s]["cpu_ms"] = round(statistics.median(cpus[s]), 1)
            if s == "tencache":
                out["profile"] = msgspec.to_builtins(engine.profile())
            engine.close()
    return out


def _summary(
    engine: OffloadEngine, times: list[float], losses: list[float], steps: int
) -> dict[str, Any]:
    st = engine.stats
    moved = st.bytes_in + st.bytes_out
    assert engine.cache is not None
    homes = [e.home for e in engine.cache.residency]
    return {
        "step_ms": round(statistics.median(times), 1),
        "step_ms_mean": round(statistics.fmean(times), 1),
        "fast_tier_hit_rate": round(st.hit_rate, 4),
        "late_rate": round(st.late / st.accesses, 4) if st.accesses else 0.0,
        "bytes_moved": moved,
        "bytes_moved_per_step": moved // steps,
        "peak_fast_bytes": st.peak_fast_bytes,
        "peak_host_bytes": st.peak_host_bytes,
        "migration_ms_p50": round(percentile(st.migration_ms, 50), 3),
        "migration_ms_p99": round(percentile(st.migration_ms, 99), 3),
        "tensors_on_nvme": sum(h is Tier.NVME for h in homes),
        "params_on_nvme": sum(
            e.home is Tier.NVME and e.spec.kind == "param" for e in engine.cache.residency
        ),
        "losses": losses,
    }


def _calibration(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """For the simulator's offload cost model: the copy bandwidth seen when nothing
    overlaps (`lru` moves everything on demand), and the share of `tencache`'s
    copy time hidden behind compute at that bandwidth."""
    none, lru, ten = runs["none"], runs["lru"], runs["tencache"]
    exposed_ms = max(lru["step_ms"] - none["step_ms"], 1e-3)
    gbps = lru["bytes_moved_per_step"] / exposed_ms / 1e6
    ten_copy_ms = ten["bytes_moved_per_step"] / gbps / 1e6 if gbps else 0.0
    hidden = 1 - max(ten["step_ms"] - none["step_ms"], 0.0) / ten_copy_ms if ten_copy_ms else 0.0
    return {"copy_gbps_unhidden": round(gbps, 3), "tencache_hidden_fraction": round(hidden, 3)}


def _model_facts(a: BenchArgs) -> dict[str, Any]:
    cfg = GPTConfig(vocab=a.vocab, seq=a.seq, layers=a.layers, dim=a.dim, heads=8)
    pbytes = sum(p.numel() * 4 for p in GPT(cfg).parameters())
    return {
        "config": asdict(cfg),
        "batch": a.batch,
        "param_bytes": pbytes,
        "optimizer_bytes": 2 * pbytes,
        "fast_budget_bytes": int(pbytes * a.fast_frac),
        "host_budget_bytes": int(pbytes * a.host_frac),
    }


def _table(result: dict[str, Any]) -> Table:
    t = Table(title="rltune bench offload (median step; hit rate over measured steps)")
    for col in (
        "strategy",
        "step ms",
        "hit rate",
        "MB moved/step",
        "fast MB",
        "host MB",
        "loss = none",
    ):
        t.add_column(col, justify="right")
    for s in STRATEGIES:
        r = result[s]
        t.add_row(
            s,
            f"{r['step_ms']:.0f}",
            f"{r['fast_tier_hit_rate']:.3f}",
            f"{r['bytes_moved_per_step'] / 1e6:.0f}",
            f"{r['peak_fast_bytes'] / 1e6:.0f}",
            f"{r['peak_host_bytes'] / 1e6:.0f}",
            str(result["losses_identical_to_none"][s]),
        )
    ratios = result["ratios"]
    t.caption = (
        f"tencache vs lru: {ratios['tencache_vs_lru']:.2f}x faster per step   "
        f"tencache vs fixed: {ratios['tencache_vs_fixed']:.2f}x faster per step"
    )
    return t


def main(argv: list[str]) -> int:
    a = _parse(argv)
    torch.set_num_threads(1)
    console = Console(stderr=a.json == "-")
    root = Path(tempfile.mkdtemp(prefix="rltune-offload-", dir=a.nvme_dir))
    try:
        runs = _run(a, root, console)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {s: runs[s] for s in STRATEGIES}
    result["model"] = _model_facts(a)
    result["steps"], result["warmup_steps"], result["torch_threads"] = a.steps, a.warmup, 1
    result["io_threads"], result["swap_dir"] = a.io_threads, str(root)
    ref = runs["none"]["losses"]
    result["losses_identical_to_none"] = {s: runs[s]["losses"] == ref for s in STRATEGIES}
    t = runs["tencache"]["step_ms"]
    result["ratios"] = {
        "tencache_vs_lru": round(runs["lru"]["step_ms"] / t, 3),
        "tencache_vs_fixed": round(runs["fixed"]["step_ms"] / t, 3),
        "tencache_vs_none": round(runs["none"]["step_ms"] / t, 3),
    }
    result["calibration"] = _calibration(runs)
    result["profile"] = runs["profile"]
    console.print(_table(result))
    if a.json:
        write_json(result, a.json)
    return 0 if all(result["losses_identical_to_none"].values()) else 1
