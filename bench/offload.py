"""`rltune bench offload [--json OUT]`: 10Cache against no offload, naive LRU
offload and ZeRO-Infinity-style fixed buffers, side by side, on several
architectures (`--archs`, default: the project's GPT, GPT-2, Llama and BERT
built from Hugging Face configs, and ResNet-18; see `offload_agent/models.py`).

For each architecture every strategy trains the same model from the same seed
on the same batches with the same per-parameter AdamW. The fast tier holds
`--fast-frac` of the parameter+state bytes, the host tier `--host-frac`, so
tensors (params included) spill to swap files on the real disk (O_DIRECT when
it allows). Peak fast-tier and host buffer bytes are reported per strategy.
Steps are interleaved round-robin across the four engines (starting one
further each step) so that load from other processes hits all of them
alike; each step's time includes waiting for every copy it started (nothing
is left running into the next one). Without
CUDA (`--device cpu`) the fast tier is host memory: torch computes on one
thread and the other core is the I/O side (what a GPU's copy engines are).
With CUDA (`--device cuda`, or `auto` where there is a GPU) the fast tier is
GPU memory, host buffers are pinned and copies go over the real link on side
streams; kernels are made deterministic so the losses can match exactly.
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

from offload_agent.device import CpuDevice, Device, deterministic_cuda, select_device
from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.link import LinkEmulation
from offload_agent.models import ALL_ARCHS, ARCHS, Workload, workload
from offload_agent.nvme import NvmeStore
from offload_agent.optim import AdamW
from offload_agent.residency import Tier
from offload_agent.stats import percentile
from offload_agent.strategies import STRATEGIES
from services.profiler.planner import build_plan
from shared.cli.common import write_json
from shared.errors import UserError
from shared.sim.offload_cost import TOKENS_PER_GPU_STEP

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
    # none: copies are memcpys (the fast tier is host memory); auto: they also take
    # the wall time of a GPU's links, scaled to this machine (`_link_rates`);
    # PCIE,NVME: those rates in GB/s
    link_gbps: str = "none"
    # cpu: the fast tier is host memory; cuda: GPU memory, pinned host buffers,
    # copies on a side stream (the real link); auto: cuda when there is one
    device: str = "auto"


def _parse(argv: list[str]) -> BenchArgs:
    p = argparse.ArgumentParser(prog="rltune bench offload", description=__doc__)
    for field, default in asdict(BenchArgs()).items():
        kind = type(default) if default is not None else str
        p.add_argument("--" + field.replace("_", "-"), type=kind, default=default)
    a = BenchArgs(**vars(p.parse_args(argv)))
    if a.steps < 1 or a.warmup < 1 or a.dim % 8 or a.fast_frac <= 0:
        raise UserError("need --steps >= 1, --warmup >= 1, --dim a multiple of 8, --fast-frac > 0")
    unknown = set(a.archs.split(",")) - set(ALL_ARCHS)
    if unknown:
        raise UserError(f"--archs: unknown {sorted(unknown)}; choose from {', '.join(ALL_ARCHS)}")
    if a.link_gbps not in ("none", "auto"):
        _explicit_rates(a.link_gbps)
    if a.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device {a.device!r}: choose auto, cpu or cuda")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch.cuda.is_available() is False on this machine")
    if _device_name(a) == "cuda" and a.link_gbps != "none":
        raise UserError(
            "--link-gbps emulates a link for a host-memory fast tier; on a GPU "
            "the link is real: leave it at none (or pass --device cpu)"
        )
    return a


def _device_name(a: BenchArgs) -> str:
    if a.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return a.device


def _explicit_rates(text: str) -> tuple[float, float]:
    try:
        pcie, nvme = (float(x) for x in text.split(","))
    except ValueError:
        pcie = nvme = 0.0
    if not (pcie > 0 and nvme > 0):
        raise UserError(
            f"--link-gbps {text!r}: give none, auto, or two rates PCIE,NVME in GB/s (e.g. 0.9,0.2)"
        )
    return pcie, nvme


# The GPU the emulated link stands for: an A100 computing in fp32 (the bench's
# dtype; PyTorch does not use TF32 for fp32 matmuls by default) behind a
# PCIe 4.0 x16 link, with a PCIe 4.0 NVMe SSD. Spec-sheet figures, stated.
GPU_FP32_TFLOPS = 19.5  # A100 fp32 peak
GPU_PCIE_GBPS = 25.0  # PCIe 4.0 x16, achieved host <-> GPU copy rate (32 GB/s raw)
GPU_NVME_GBPS = 6.0  # PCIe 4.0 NVMe SSD, sequential (6-7 GB/s reads on the spec sheets)


def _matmul_gflops(seconds: float = 0.3, rounds: int = 5) -> float:
    """This machine's fp32 matmul throughput on the bench's one torch thread
    (median of `rounds`: the load the bench's compute sees)."""
    a, b = torch.randn(256, 512), torch.randn(512, 2048)
    flop = 2 * 256 * 512 * 2048
    a @ b
    rates = []
    for _ in range(rounds):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            n += 1
        rates.append(n * flop / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def _link_rates(a: BenchArgs) -> dict[str, Any]:
    """The emulated link, or none. `auto` keeps a GPU's ratio of compute to link
    speed: the A100's PCIe and NVMe rates times (this machine's measured matmul
    GFLOP/s / the A100's) times (the work of a GPU step / the bench's step), a
    GPU step being 16,384 tokens (8 sequences of 2,048: the simulator's
    assumption, shared/sim/offload_cost.py), i.e. 16,384 / (batch x context)
    bench steps, ResNet-18 included (256 images at the defaults)."""
    if _device_name(a) == "cuda":
        return {
            "mode": "cuda",
            "gpu": torch.cuda.get_device_name(),
            "torch_cuda": str(torch.version.cuda),
        }
    if a.link_gbps == "none":
        return {"mode": "memcpy only (no link emulation)"}
    if a.link_gbps != "auto":
        pcie, nvme = _explicit_rates(a.link_gbps)
        return {"mode": "given", "pcie_gbps": pcie, "nvme_gbps": nvme}
    gflops = _matmul_gflops()
    work = TOKENS_PER_GPU_STEP / (a.batch * a.seq)
    scale = gflops / (GPU_FP32_TFLOPS * 1e3) * work
    return {
        "mode": "auto",
        "pcie_gbps": round(GPU_PCIE_GBPS * scale, 4),
        "nvme_gbps": round(GPU_NVME_GBPS * scale, 4),
        "cpu_matmul_gflops": round(gflops, 2),
        "gpu": f"A100 fp32 {GPU_FP32_TFLOPS} TFLOP/s, PCIe 4.0 x16 {GPU_PCIE_GBPS} GB/s, "
        f"NVMe {GPU_NVME_GBPS} GB/s",
        "gpu_step_in_bench_steps": round(work, 3),
    }


def _describe_link(link: dict[str, Any]) -> str:
    if link["mode"] == "cuda":
        return (
            f"copies: the real link of {link['gpu']} (CUDA {link['torch_cuda']}): fast tier in "
            "GPU memory, pinned host buffers, copies on a side stream"
        )
    if "pcie_gbps" not in link:
        return "copies: memcpy only (no link emulation)"
    text = (
        f"copies: emulated link, PCIe {link['pcie_gbps']:.3g} GB/s, "
        f"NVMe {link['nvme_gbps']:.3g} GB/s"
    )
    if link["mode"] == "auto":
        text += (
            f" (= {link['gpu']}, scaled by this machine's {link['cpu_matmul_gflops']:.1f} GFLOP/s "
            f"matmul / the GPU's and a GPU step of {link['gpu_step_in_bench_steps']:g} bench steps)"
        )
    return text


def _workload(a: BenchArgs, arch: str) -> Workload:
    return workload(
        arch,
        dim=a.dim,
        layers=a.layers,
        vocab=a.vocab,
        seq=a.seq,
        size=a.batch,
        seed=a.seed,
        device=_device_name(a),
    )


def _device(a: BenchArgs, link: dict[str, Any]) -> Device:
    device = select_device(_device_name(a))
    if isinstance(device, CpuDevice):
        device.link = _emulation(link)
    return device


def _state_bytes(model: torch.nn.Module) -> int:
    """Parameters plus AdamW's two states, in bytes."""
    return sum(
        p.numel() * p.element_size() * (3 if p.requires_grad else 1) for p in model.parameters()
    )


def _engine(
    a: BenchArgs,
    w: Workload,
    strategy: str,
    root: Path,
    io: ThreadPoolExecutor,
    link: dict[str, Any] | None = None,
    slice_states: bool | None = None,
) -> OffloadEngine:
    """`slice_states`: `EngineConfig.slice_states` (None: on for tencache only)."""
    model = _workload(a, w.arch).model  # a fresh copy from the same seed
    total = _state_bytes(model)
    config = EngineConfig(
        job_id=f"bench-{w.arch}-{strategy}",
        strategy=strategy,
        fast_budget=int(total * a.fast_frac),
        host_budget=int(total * a.host_frac),
        slice_states=slice_states,
    )
    engine = OffloadEngine(
        model,
        AdamW(lr=3e-4),
        config,
        device=_device(a, link or {}),
        store=NvmeStore(root / strategy),
        io=io,
    )
    try:
        engine.start()
    except ValueError as exc:  # budgets below the buffers a step holds at once
        raise UserError(f"{w.arch} under {strategy}: {exc}; raise --fast-frac") from exc
    return engine


def _emulation(link: dict[str, Any]) -> LinkEmulation | None:
    if "pcie_gbps" not in link:
        return None
    return LinkEmulation(link["pcie_gbps"], link["nvme_gbps"])


def _timed_step(engine: OffloadEngine, w: Workload, step: int) -> tuple[float, float, float]:
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
    return float(loss.item()), ms, cpu


def _rotated(engines: dict[str, OffloadEngine], step: int) -> list[tuple[str, OffloadEngine]]:
    """The engines in round-robin order, starting one further each step, so none
    always runs right after the same other one."""
    order = list(engines.items())
    k = step % len(order) if order else 0
    return order[k:] + order[:k]


def _step(
    engine: OffloadEngine, w: Workload, a: BenchArgs, step: int
) -> tuple[float, float, float]:
    """`_timed_step`, then tencache's plan once its warm-up profile is there."""
    out = _timed_step(engine, w, step)
    ready = engine.config.strategy == "tencache" and engine.profile_ready
    if ready and not engine.apply_plan(
        build_plan(engine.profile(), engine.budgets, window=a.window, stream_share=a.stream_share)
    ):
        raise RuntimeError(f"plan refused: {engine.last_error}")
    return out


def _run(
    a: BenchArgs, w: Workload, root: Path, console: Console, link: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Per strategy its summary; under "profile", tencache's recorded warm-up profile
    (what the simulator's offload cost model predicts step times from)."""
    out: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(a.io_threads, thread_name_prefix="offload-io") as io:
        engines: dict[str, OffloadEngine] = {}
        for s in STRATEGIES:
            try:
                engines[s] = _engine(a, w, s, root, io, link)
            except UserError as exc:  # one baseline that cannot start at this budget
                if s in ("none", "tencache"):
                    raise
                out[s] = {"cannot_start": str(exc)}
                console.print(f"[yellow]{exc}: {s} is left out of {w.arch}'s comparison")
        losses: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        times: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        cpus: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        total = (a.warmup + a.steps) * len(engines)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{w.arch} (round-robin over strategies)", total=total)
            for step in range(a.warmup + a.steps):
                for s, engine in _rotated(engines, step):
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
        "copy_wait_ms": round(st.wait_ms / steps, 1),  # per step: copies not hidden
        "late_rate": round(st.late / st.accesses, 4) if st.accesses else 0.0,
        "bytes_moved": moved,
        "bytes_moved_per_step": moved // steps,
        "peak_fast_bytes": st.peak_fast_bytes,
        "peak_host_bytes": st.peak_host_bytes,
        "fast_overflow_bytes": st.overflow_bytes,
        "plan_window": getattr(engine.cache.policy, "lead", engine.cache.policy.window),
        "sliced_params": len(engine.sliced),  # parameters whose states stream as slices
        "fetch_ahead": engine.cache.policy.window,
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


def _table(result: dict[str, Any], link: dict[str, Any]) -> Table:
    m = result["model"]
    if link["mode"] == "cuda":
        copies = f"on {link['gpu']}"
    elif "pcie_gbps" in link:
        copies = f"link PCIe {link['pcie_gbps']:.3g} / NVMe {link['nvme_gbps']:.3g} GB/s"
    else:
        copies = "copies memcpy only"
    t = Table(
        title=f"{m['arch']}: {m['parameters'] / 1e6:.1f}M parameters, fast tier "
        f"{m['fast_budget_bytes'] / 1e6:.0f} MB, host {m['host_budget_bytes'] / 1e6:.0f} MB, "
        f"{copies} (median step; hit rate over measured steps)"
    )
    for col in (
        "strategy",
        "step ms",
        "copy wait ms",
        "hit rate",
        "MB moved/step",
        "fast MB",
        "host MB",
        "lead / ahead",
        "loss = none",
    ):
        t.add_column(col, justify="right")
    for s in STRATEGIES:
        r = result[s]
        if "cannot_start" in r:
            t.add_row(s, "cannot start", *["-"] * 7)
            continue
        t.add_row(
            s,
            f"{r['step_ms']:.0f}",
            f"{r['copy_wait_ms']:.0f}",
            f"{r['fast_tier_hit_rate']:.3f}",
            f"{r['bytes_moved_per_step'] / 1e6:.0f}",
            f"{r['peak_fast_bytes'] / 1e6:.0f}",
            f"{r['peak_host_bytes'] / 1e6:.0f}",
            f"{r['plan_window']} / {r['fetch_ahead']}" if s in ("fixed", "tencache") else "-",
            str(result["losses_identical_to_none"][s]),
        )
    ratios = result["ratios"]
    t.caption = "   ".join(
        f"tencache vs {s}: "
        + ("cannot start" if ratios[f"tencache_vs_{s}"] is None else
           f"{ratios[f'tencache_vs_{s}']:.2f}x faster per step")
        for s in ("lru", "fixed")
    ) + f"   ({copies})"  # fmt: skip
    return t


def _arch_result(
    a: BenchArgs, arch: str, root: Path, console: Console, link: dict[str, Any]
) -> dict[str, Any]:
    w = _workload(a, arch)
    runs = _run(a, w, root / arch, console, link)
    result: dict[str, Any] = {s: runs[s] for s in STRATEGIES}
    result["model"] = _model_facts(a, w)
    ran = [s for s in STRATEGIES if "losses" in runs[s]]
    ref = runs["none"]["losses"]
    result["losses_identical_to_none"] = {s: runs[s]["losses"] == ref for s in ran}
    t = runs["tencache"]["step_ms"]
    result["ratios"] = {  # None: that strategy could not start at this budget
        f"tencache_vs_{s}": round(runs[s]["step_ms"] / t, 3) if s in ran else None
        for s in ("lru", "fixed", "none")
    }
    if "lru" in ran:
        result["calibration"] = _calibration(runs)
    result["profile"] = runs["profile"]
    return result


def main(argv: list[str]) -> int:
    a = _parse(argv)
    torch.set_num_threads(1)
    if _device_name(a) == "cuda":  # so every strategy's losses can equal `none`'s
        deterministic_cuda()
    console = Console(stderr=a.json == "-")
    root = Path(tempfile.mkdtemp(prefix="rltune-offload-", dir=a.nvme_dir))
    result: dict[str, Any] = {}
    link = _link_rates(a)
    console.print(_describe_link(link))
    try:
        for arch in a.archs.split(","):
            result[arch] = _arch_result(a, arch, root, console, link)
            console.print(_table(result[arch], link))
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
        "link": link,
        "device": _device_name(a),
        "model_dims": {
            "dim": a.dim,
            "layers": a.layers,
            "vocab": a.vocab,
            "seq": a.seq,
            "batch": a.batch,
        },
    }
    if a.json:
        write_json(result, a.json)
    archs = a.archs.split(",")
    return 0 if all(all(result[x]["losses_identical_to_none"].values()) for x in archs) else 1
