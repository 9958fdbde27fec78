"""`rltune bench offload [--json OUT]`: 10Cache against no offload, naive LRU
offload and ZeRO-Infinity-style fixed buffers, side by side, on several
architectures (`--archs`, default: the project's GPT, GPT-2, Llama and BERT
built from Hugging Face configs, and ResNet-18; see `offload_agent/models.py`).

For each architecture every strategy trains the same model from the same seed
on the same batches with the same per-parameter AdamW. The fast tier holds
`--fast-frac` of the parameter+state bytes, the host tier `--host-frac`, so
tensors (params included) spill to swap files on the real disk (O_DIRECT when
it allows). Peak fast-tier and host buffer bytes are reported per strategy.
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
from offload_agent.models import ARCHS, Workload, workload
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
    fast_frac: float = 0.3  # fast budget as a fraction of parameter + AdamW state bytes
    host_frac: float = 0.07  # host budget as a fraction of parameter + AdamW state bytes
    archs: str = ",".join(ARCHS)  # comma-separated
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
    unknown = set(a.archs.split(",")) - set(ARCHS)
    if unknown:
        raise UserError(f"--archs: unknown {sorted(unknown)}; choose from {', '.join(ARCHS)}")
    return a


def _workload(a: BenchArgs, arch: str) -> Workload:
    return workload(
        arch, dim=a.dim, layers=a.layers, vocab=a.vocab, seq=a.seq, size=a.batch, seed=a.seed
    )


def _state_bytes(model: torch.nn.Module) -> int:
    """Parameters plus AdamW's two states, in bytes."""
    return sum(
        p.numel() * p.element_size() * (3 if p.requires_grad else 1) for p in model.parameters()
    )


def _engine(
    a: BenchArgs, w: Workload, strategy: str, root: Path, io: ThreadPoolExecutor
) -> OffloadEngine:
    model = _workload(a, w.arch).model  # a fresh copy from the same seed
    total = _state_bytes(model)
    config = EngineConfig(
        job_id=f"bench-{w.arch}-{strategy}",
        strategy=strategy,
        fast_budget=int(total * a.fast_frac),
        host_budget=int(total * a.host_frac),
    )
    engine = OffloadEngine(
        model, AdamW(lr=3e-4), config, device=CpuDevice(), store=NvmeStore(root / strategy), io=io
    )
    try:
        engine.start()
    except ValueError as exc:  # budgets below the buffers a step holds at once
        raise UserError(f"{w.arch} under {strategy}: {exc}; raise --fast-frac") from exc
    return engine


def _step(
    engine: OffloadEngine, w: Workload, a: BenchArgs, step: int
) -> tuple[float, float, float]:
    """One training step; (loss, wall ms including every copy it started, process
    CPU ms over that time: compute plus the I/O threads' own work)."""
    t0, c0 = time.perf_counter(), time.process_time()
    with engine.step():
        loss = w.loss(engine.model, step)
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


def _run(a: BenchArgs, w: Workload, root: Path, console: Console) -> dict[str, dict[str, Any]]:
    """Per strategy its summary; under "profile", tencache's recorded warm-up profile
    (what the simulator's offload cost model predicts step times from)."""
    out: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(a.io_threads, thread_name_prefix="offload-io") as io:
        engines = {s: _engine(a, w, s, root, io) for s in STRATEGIES}
        losses: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        times: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        cpus: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        total = (a.warmup + a.steps) * len(engines)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{w.arch} (round-robin over strategies)", total=total)
            for step in range(a.warmup + a.steps):
                for s, engine in engines.items():
                    if step == a.warmup:
                        engine.stats.reset()
                    loss, ms, cpu = _step(engine, w, a, step)
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
        "fast_overflow_bytes": st.overflow_bytes,
        "plan_window": getattr(engine.cache.policy, "window", 0),
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


def _model_facts(a: BenchArgs, w: Workload) -> dict[str, Any]:
    pbytes = sum(p.numel() * p.element_size() for p in w.model.parameters())
    total = _state_bytes(w.model)
    return {
        "arch": w.arch,
        "config": w.config,
        "parameters": sum(p.numel() for p in w.model.parameters()),
        "batch": a.batch,
        "seq": a.seq,
        "param_bytes": pbytes,
        "optimizer_bytes": total - pbytes,
        "fast_budget_bytes": int(total * a.fast_frac),
        "host_budget_bytes": int(total * a.host_frac),
    }


def _table(result: dict[str, Any]) -> Table:
    m = result["model"]
    t = Table(
        title=f"{m['arch']}: {m['parameters'] / 1e6:.1f}M parameters, fast tier "
        f"{m['fast_budget_bytes'] / 1e6:.0f} MB, host {m['host_budget_bytes'] / 1e6:.0f} MB "
        "(median step; hit rate over measured steps)"
    )
    for col in (
        "strategy",
        "step ms",
        "hit rate",
        "MB moved/step",
        "fast MB",
        "host MB",
        "window",
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
            str(r["plan_window"]),
            str(result["losses_identical_to_none"][s]),
        )
    ratios = result["ratios"]
    t.caption = (
        f"tencache vs lru: {ratios['tencache_vs_lru']:.2f}x faster per step   "
        f"tencache vs fixed: {ratios['tencache_vs_fixed']:.2f}x faster per step"
    )
    return t


def _arch_result(a: BenchArgs, arch: str, root: Path, console: Console) -> dict[str, Any]:
    w = _workload(a, arch)
    runs = _run(a, w, root / arch, console)
    result: dict[str, Any] = {s: runs[s] for s in STRATEGIES}
    result["model"] = _model_facts(a, w)
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
    return result


def main(argv: list[str]) -> int:
    a = _parse(argv)
    torch.set_num_threads(1)
    console = Console(stderr=a.json == "-")
    root = Path(tempfile.mkdtemp(prefix="rltune-offload-", dir=a.nvme_dir))
    result: dict[str, Any] = {}
    try:
        for arch in a.archs.split(","):
            result[arch] = _arch_result(a, arch, root, console)
            console.print(_table(result[arch]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["settings"] = {
        "steps": a.steps,
        "warmup_steps": a.warmup,
        "torch_threads": 1,
        "io_threads": a.io_threads,
        "fast_frac": a.fast_frac,
        "host_frac": a.host_frac,
        "swap_dir": str(root),
    }
    if a.json:
        write_json(result, a.json)
    archs = a.archs.split(",")
    return 0 if all(all(result[x]["losses_identical_to_none"].values()) for x in archs) else 1
