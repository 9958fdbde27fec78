"""`rltune bench offload [--json OUT]`: 10Cache against no offload, naive LRU
offload and ZeRO-Infinity-style fixed buffers, side by side, on several
architectures (`--archs`, default: the project's GPT, GPT-2, Llama and BERT
built from Hugging Face configs, and ResNet-18; see `offload_agent/models.py`).

For each architecture every strategy trains the same model from the same seed
on the same batches with the same per-parameter AdamW. The fast tier holds
`--fast-frac` of the parameter+state bytes, the host tier `--host-frac`, so
tensors (params included) spill to swap files on the real disk (O_DIRECT when
it allows). Peak fast-tier and host buffer bytes are reported per strategy.
After `--warmup` steps, each engine runs `--repeats` blocks of one untimed
lead-in step and `--steps` timed steps, the blocks interleaved round-robin
across the engines (starting one further each repeat) so that load from
other processes hits all of them alike. A timed step runs from the end of
the step before it to its own end, with nothing drained in between: the
prefetches a step starts for the next one are paid where they are waited
for, as in a training loop (the lead-in absorbs the drain between blocks).
Step times are medians over all timed steps, with quartiles and range; each
ratio also per repeat (`ratio_spread`). Without
CUDA (`--device cpu`) the fast tier is host memory: torch computes on one
thread and the other core is the I/O side (what a GPU's copy engines are).
With CUDA (`--device cuda`, or `auto` where there is a GPU) the fast tier is
GPU memory, host buffers are pinned and copies go over the real link on side
streams; kernels are made deterministic so the losses can match exactly.

`--strategies` picks the strategies (`none` and `tencache` always among them);
`deepspeed` and `deepspeed-cpu` add DeepSpeed ZeRO-3 with parameters and
optimizer states offloaded to NVMe (ZeRO-Infinity) or host memory, at the same
fast-tier budget (`bench/offload_deepspeed.py`; `pip install -e .[deepspeed]`).
Their losses are compared with `none`'s by size (`loss_diff_vs_none`), not for
equality: DeepSpeed steps with its own CPU AdamW kernel. Every strategy's GPU
memory (on CUDA) is reported as what it keeps between steps
(`gpu_resident_bytes`) plus its largest rise during a timed block
(`gpu_step_peak_bytes`), and host memory as the process's resident-set growth
when it was built (`host_rss_bytes`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.offload_deepspeed import DEEPSPEED_STRATEGIES, DeepSpeedRun, available
from offload_agent.device import CpuDevice, Device, deterministic_cuda, select_device
from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.link import LinkEmulation
from offload_agent.models import ALL_ARCHS, ARCHS, Workload, workload
from offload_agent.nvme import NvmeStore
from offload_agent.optim import AdamW
from offload_agent.residency import Tier
from offload_agent.stats import percentile
from offload_agent.strategies import STRATEGIES
from shared.errors import UserError
from shared.jsonfile import write_json
from shared.offload.planner import build_plan
from shared.sim.offload_cost import TOKENS_PER_GPU_STEP

__all__ = ["main"]

Runner = OffloadEngine | DeepSpeedRun  # what the interleaved loop drives
_R = TypeVar("_R", bound=Runner)


@dataclass(frozen=True)
class BenchArgs:
    layers: int = 4
    dim: int = 512
    vocab: int = 2048
    seq: int = 64
    batch: int = 4
    steps: int = 2  # timed steps per strategy in each repeat (after one lead-in)
    repeats: int = 4  # interleaved blocks per strategy: steps x repeats timed steps
    # continuous: a step from the end of the one before (what a training loop
    # sees); both: also the previous accounting (each step drained at its end,
    # in the same repeats: `step_ms_drained`), to compare the two
    timing: str = "continuous"
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
    # comma-separated; none and tencache always; deepspeed, deepspeed-cpu need the extra
    strategies: str = ",".join(STRATEGIES)


def _parse(argv: list[str]) -> BenchArgs:
    p = argparse.ArgumentParser(prog="rltune bench offload", description=__doc__)
    for key, default in asdict(BenchArgs()).items():
        kind = type(default) if default is not None else str
        p.add_argument("--" + key.replace("_", "-"), type=kind, default=default)
    a = BenchArgs(**vars(p.parse_args(argv)))
    if a.steps < 1 or a.repeats < 1 or a.warmup < 1 or a.dim % 8 or a.fast_frac <= 0:
        raise UserError(
            "need --steps >= 1, --repeats >= 1, --warmup >= 1, --dim a multiple of 8, "
            "--fast-frac > 0"
        )
    unknown = set(a.archs.split(",")) - set(ALL_ARCHS)
    if unknown:
        raise UserError(f"--archs: unknown {sorted(unknown)}; choose from {', '.join(ALL_ARCHS)}")
    if a.link_gbps not in ("none", "auto"):
        _explicit_rates(a.link_gbps)
    if a.timing not in ("continuous", "both"):
        raise UserError(f"--timing {a.timing!r}: choose continuous or both")
    if a.device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device {a.device!r}: choose auto, cpu or cuda")
    _strategies(a)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch.cuda.is_available() is False on this machine")
    if _device_name(a) == "cuda" and a.link_gbps != "none":
        raise UserError(
            "--link-gbps emulates a link for a host-memory fast tier; on a GPU "
            "the link is real: leave it at none (or pass --device cpu)"
        )
    return a


def _strategies(a: BenchArgs) -> tuple[str, ...]:
    """`--strategies` in the bench's order, checked."""
    asked = [s for s in a.strategies.split(",") if s]
    known = (*STRATEGIES, *DEEPSPEED_STRATEGIES)
    unknown = sorted(set(asked) - set(known))
    if unknown:
        raise UserError(f"--strategies: unknown {unknown}; choose from {', '.join(known)}")
    if not {"none", "tencache"} <= set(asked):
        raise UserError(
            "--strategies must include none and tencache (the reference and the engine)"
        )
    if set(asked) & set(DEEPSPEED_STRATEGIES):
        why = available()
        if why is not None:
            raise UserError(
                f"--strategies deepspeed: {why}; install it with pip install -e .[deepspeed]"
            )
    return tuple(s for s in known if s in asked)


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


@dataclass
class Measured:
    """One engine's measured steps. `blocks[r]`: the wall ms of each measured step
    of repeat r, each from the end of the step before it to its own end, with
    nothing drained in between: a prefetch a step starts for the next one
    counts where its wait falls, as in a training loop. Counters are summed
    over the measured steps only."""

    losses: dict[int, float] = field(default_factory=dict)  # step index -> loss
    blocks: list[list[float]] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    hits: int = 0
    late: int = 0
    misses: int = 0
    wait_ms: float = 0.0
    bytes_moved: int = 0
    link_busy_ms: dict[str, float] = field(default_factory=dict)  # emulated link, summed
    tail_ms: list[float] = field(default_factory=list)  # each block's drain, not counted
    # `--timing both`: steps timed the previous way, each from a drained cache to
    # the end of its own drain (which waits for the next step's prefetches too)
    drained: list[float] = field(default_factory=list)
    # on CUDA, per block: the most GPU memory allocated above the block's start
    gpu_step_peak: list[int] = field(default_factory=list)

    @property
    def times(self) -> list[float]:
        return [t for b in self.blocks for t in b]

    @property
    def steps(self) -> int:
        return len(self.times)

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.late + self.misses
        return self.hits / n if n else 1.0

    @property
    def late_rate(self) -> float:
        n = self.hits + self.late + self.misses
        return self.late / n if n else 0.0


def _counters(engine: Runner) -> tuple[int, int, int, float, int]:
    st = engine.stats
    return st.hits, st.late, st.misses, st.wait_ms, st.bytes_in + st.bytes_out


def _link_busy(engine: Runner) -> dict[str, float]:
    """Seconds each emulated link has been reserved (none without emulation)."""
    link = getattr(engine.device, "link", None)
    if not isinstance(link, LinkEmulation):
        return {}
    return {"nvme": link.nvme.busy_s, "pcie_h2d": link.h2d.busy_s, "pcie_d2h": link.d2h.busy_s}


def _one_step(engine: Runner, w: Workload, step: int) -> float:
    with engine.step():
        loss = w.loss(engine.model, step)
        loss.backward()
    return float(loss.item())


def _timed_block(
    engine: Runner,
    w: Workload,
    first: int,
    n: int,
    m: Measured,
    after: Callable[[Runner], None],
) -> None:
    """Steps `first` .. `first + n` of one engine back to back; the first is a
    lead-in, not timed: it starts from a drained cache, so the copies the drain
    finished would make it look faster than a step in a running loop. Each of
    the next `n` is timed from the end of the step before it (not from a
    drain) to its own end (the engine synchronises the device there), so the
    prefetches one step starts for the next are not waited for at its end but
    count in whichever step waits for them. After the block everything in flight
    is drained, untimed, so that the next engine's steps start with the I/O
    threads and the link idle."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    m.losses[first] = _one_step(engine, w, first)
    after(engine)
    before, busy = _counters(engine), _link_busy(engine)
    t_prev, c_prev = time.perf_counter(), time.process_time()
    block: list[float] = []
    for step in range(first + 1, first + 1 + n):
        m.losses[step] = _one_step(engine, w, step)
        t, c = time.perf_counter(), time.process_time()
        block.append((t - t_prev) * 1e3)
        m.cpu.append((c - c_prev) * 1e3)
        after(engine)  # a re-plan (tencache after its warm-up) is not timed
        t_prev, c_prev = time.perf_counter(), time.process_time()
    now = _counters(engine)
    m.hits += now[0] - before[0]
    m.late += now[1] - before[1]
    m.misses += now[2] - before[2]
    m.wait_ms += now[3] - before[3]
    m.bytes_moved += now[4] - before[4]
    for k, v in _link_busy(engine).items():  # reservations up to the last step's end
        m.link_busy_ms[k] = m.link_busy_ms.get(k, 0.0) + (v - busy[k]) * 1e3
    m.blocks.append(block)
    if cuda:
        m.gpu_step_peak.append(torch.cuda.max_memory_allocated() - base)
    assert engine.cache is not None
    t0 = time.perf_counter()
    engine.cache.drain()
    m.tail_ms.append((time.perf_counter() - t0) * 1e3)


def _drained_block(
    engine: Runner,
    w: Workload,
    first: int,
    n: int,
    m: Measured,
    after: Callable[[Runner], None],
) -> None:
    """The accounting this bench used before: each step timed up to the end of a
    drain of every copy in flight, the next step's prefetches included."""
    assert engine.cache is not None
    for step in range(first, first + n):
        t0 = time.perf_counter()
        m.losses[step] = _one_step(engine, w, step)
        engine.cache.drain()
        m.drained.append((time.perf_counter() - t0) * 1e3)
        after(engine)


def _rotated(engines: dict[str, _R], step: int) -> list[tuple[str, _R]]:
    """The engines in round-robin order, starting one further each step, so none
    always runs right after the same other one."""
    order = list(engines.items())
    k = step % len(order) if order else 0
    return order[k:] + order[:k]


def interleaved(
    engines: dict[str, _R],
    w: Workload,
    a: BenchArgs,
    after: Callable[[str, _R], None],
    advance: Callable[[], None] = lambda: None,
) -> dict[str, Measured]:
    """`a.warmup` steps per engine, round-robin, each drained at its end (the first
    is tencache's recorded profile; `after(name, engine)` runs after every
    step: the bench plans there), then `a.repeats` blocks per engine of one
    lead-in and `a.steps` timed steps (`_timed_block`), round-robin, starting
    one engine further each repeat, so that load from other processes hits all
    of them alike (with `a.timing == "both"`, each block is followed by
    `a.steps` steps timed the previous way, `_drained_block`). Every engine runs
    the same step indices (the same batches)."""
    out = {name: Measured() for name in engines}
    for step in range(a.warmup):
        for name, engine in _rotated(engines, step):
            out[name].losses[step] = _one_step(engine, w, step)
            assert engine.cache is not None
            engine.cache.drain()
            after(name, engine)
            advance()
    for engine in engines.values():
        engine.stats.reset()
    both = a.timing == "both"
    per_repeat = a.steps + 1 + (a.steps if both else 0)
    for r in range(a.repeats):
        first = a.warmup + r * per_repeat
        for name, engine in _rotated(engines, r):
            _timed_block(engine, w, first, a.steps, out[name], partial(after, name))
            if both:
                then = first + a.steps + 1
                _drained_block(engine, w, then, a.steps, out[name], partial(after, name))
            for _ in range(per_repeat):
                advance()
    return out


def _plan_after(a: BenchArgs) -> Callable[[str, Runner], None]:
    def after(name: str, engine: Runner) -> None:
        """tencache's plan once its warm-up profile is there."""
        if not isinstance(engine, OffloadEngine) or engine.config.strategy != "tencache":
            return
        if not engine.profile_ready:
            return
        plan = build_plan(
            engine.profile(), engine.budgets, window=a.window, stream_share=a.stream_share
        )
        if not engine.apply_plan(plan):
            raise RuntimeError(f"plan refused: {engine.last_error}")

    return after


def _run(
    a: BenchArgs, w: Workload, root: Path, console: Console, link: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Per strategy its summary; under "profile", tencache's recorded warm-up profile
    (what the simulator's offload cost model predicts step times from)."""
    out: dict[str, dict[str, Any]] = {}
    memory: dict[str, tuple[int, int]] = {}
    with ThreadPoolExecutor(a.io_threads, thread_name_prefix="offload-io") as io:
        engines: dict[str, Runner] = {}
        for s in _strategies(a):
            gpu, rss = _gpu_allocated(), _rss_bytes()
            try:
                engines[s] = _deepspeed(a, w, s, root) if s in DEEPSPEED_STRATEGIES else (
                    _engine(a, w, s, root, io, link)
                )  # fmt: skip
            except UserError as exc:  # one baseline that cannot start at this budget
                if s in ("none", "tencache"):
                    raise
                out[s] = {"cannot_start": str(exc)}
                console.print(f"[yellow]{exc}: {s} is left out of {w.arch}'s comparison")
                continue
            memory[s] = (_gpu_allocated() - gpu, _rss_bytes() - rss)
        per_repeat = a.steps + 1 + (a.steps if a.timing == "both" else 0)
        total = (a.warmup + a.repeats * per_repeat) * len(engines)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{w.arch} (interleaved over strategies)", total=total)
            measured = interleaved(engines, w, a, _plan_after(a), lambda: progress.advance(task))
        for s, engine in engines.items():
            if isinstance(engine, DeepSpeedRun):
                out[s] = _ds_summary(engine, measured[s])
            else:
                out[s] = _summary(engine, measured[s])
            kept, out[s]["host_rss_bytes"] = memory[s]
            # below zero where building it freed memory an earlier engine held: unknown
            out[s]["gpu_resident_bytes"] = kept if kept >= 0 else None
            peaks = measured[s].gpu_step_peak
            out[s]["gpu_step_peak_bytes"] = max(peaks) if peaks else None
            if s == "tencache":
                assert isinstance(engine, OffloadEngine)
                out["profile"] = msgspec.to_builtins(engine.profile())
            engine.close()
    return out


def _deepspeed(a: BenchArgs, w: Workload, strategy: str, root: Path) -> DeepSpeedRun:
    """DeepSpeed ZeRO-3 on a fresh copy of the model, at the other strategies' budgets."""
    model = _workload(a, w.arch).model
    total = _state_bytes(model)
    try:
        return DeepSpeedRun(
            model,
            AdamW(lr=3e-4),
            strategy=strategy,
            fast_budget=int(total * a.fast_frac),
            host_budget=int(total * a.host_frac),
            batch=a.batch,
            device=_device_name(a),
            swap_dir=root,
            io_threads=a.io_threads,
        )
    except (
        RuntimeError,
        ValueError,
        AssertionError,
        OSError,
    ) as exc:  # e.g. an op that cannot build
        raise UserError(f"{w.arch} under {strategy}: {type(exc).__name__}: {exc}") from exc


def _gpu_allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def _rss_bytes() -> int:
    """This process's resident set (Linux; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _ds_summary(run: DeepSpeedRun, m: Measured) -> dict[str, Any]:
    """A DeepSpeed strategy's timings; the cache counters it does not expose are None."""
    k = run.knobs
    return {
        "step_ms": round(statistics.median(m.times), 1),
        "step_ms_mean": round(statistics.fmean(m.times), 1),
        "step_ms_spread": spread(m.times),
        "step_ms_blocks": [[round(t, 1) for t in b] for b in m.blocks],
        "fast_tier_hit_rate": None,  # DeepSpeed counts no hits
        "copy_wait_ms": None,
        "bytes_moved_per_step": None,  # nor the bytes it copies
        "drain_ms_after_block": round(statistics.median(m.tail_ms), 1),
        "cpu_ms": round(statistics.median(m.cpu), 1),
        "zero3": {
            "stage3_max_live_parameters": k.max_live,
            "stage3_prefetch_bucket_size": k.prefetch,
            "stage3_param_persistence_threshold": k.persistence,
            "reduce_bucket_size": k.reduce_bucket,
            "offload_param_buffer_count": k.buffer_count,
            "offload_param_buffer_size": k.buffer_size,
            "sub_group_size": k.sub_group,
            "offload": run.ds_config["zero_optimization"]["offload_param"]["device"],
        },
        "losses": [m.losses[i] for i in sorted(m.losses)],
    }


def spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles and range of `values` (rounded)."""
    qs = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {
        "median": round(statistics.median(values), 3),
        "p25": round(qs[0], 3),
        "p75": round(qs[2], 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def _summary(engine: OffloadEngine, m: Measured) -> dict[str, Any]:
    st = engine.stats
    steps = m.steps
    assert engine.cache is not None
    homes = [e.home for e in engine.cache.residency]
    return {
        "step_ms": round(statistics.median(m.times), 1),
        "step_ms_mean": round(statistics.fmean(m.times), 1),
        "step_ms_spread": spread(m.times),
        "step_ms_blocks": [[round(t, 1) for t in b] for b in m.blocks],
        "fast_tier_hit_rate": round(m.hit_rate, 4),
        "copy_wait_ms": round(m.wait_ms / steps, 1),  # per step: copies not hidden
        "late_rate": round(m.late_rate, 4),
        "bytes_moved": m.bytes_moved,
        "bytes_moved_per_step": m.bytes_moved // steps,
        "drain_ms_after_block": round(statistics.median(m.tail_ms), 1),  # not counted
        # per timed step, each emulated link's reserved time: near the step time,
        # that link bounds the step (NVMe on ResNet-18 at 30%)
        "link_busy_ms_per_step": {k: round(v / steps, 1) for k, v in m.link_busy_ms.items()},
        **({"step_ms_drained": round(statistics.median(m.drained), 1)} if m.drained else {}),
        "cpu_ms": round(statistics.median(m.cpu), 1),
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
        "losses": [m.losses[k] for k in sorted(m.losses)],
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
        f"{copies} (median step; hit rate over measured steps); load average "
        f"{result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f}"
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
        "GPU MB kept + step",
        "RSS MB",
        "loss = none",
    ):
        t.add_column(col, justify="right")
    for s in result.get("strategies", STRATEGIES):
        r = result[s]
        if "cannot_start" in r:
            t.add_row(s, "cannot start", *["-"] * 9)
            continue
        ds = s in DEEPSPEED_STRATEGIES  # no cache counters; losses compared by size
        peak = r.get("gpu_step_peak_bytes")
        diff = result["loss_diff_vs_none"][s]
        t.add_row(
            s,
            f"{r['step_ms']:.0f} ({r['step_ms_spread']['p25']:.0f}-"
            f"{r['step_ms_spread']['p75']:.0f})",
            "n/a" if ds else f"{r['copy_wait_ms']:.0f}",
            "n/a" if ds else f"{r['fast_tier_hit_rate']:.3f}",
            "n/a" if ds else f"{r['bytes_moved_per_step'] / 1e6:.0f}",
            "-" if ds else f"{r['peak_fast_bytes'] / 1e6:.0f}",
            "-" if ds else f"{r['peak_host_bytes'] / 1e6:.0f}",
            f"{r['plan_window']} / {r['fetch_ahead']}" if s in ("fixed", "tencache") else "-",
            "-" if peak is None else
            ("?" if r["gpu_resident_bytes"] is None else f"{r['gpu_resident_bytes'] / 1e6:.0f}")
            + f" + {peak / 1e6:.0f}",
            f"{r['host_rss_bytes'] / 1e6:.0f}",
            f"no, rel {diff['max_rel']:.1e}" if ds and diff["max_abs"] else
            str(result["losses_identical_to_none"][s]),
        )  # fmt: skip
    ratios = result["ratios"]
    spreads = result["ratio_spread"]
    t.caption = "   ".join(
        f"tencache vs {s}: "
        + ("cannot start" if ratios[f"tencache_vs_{s}"] is None else
           f"{ratios[f'tencache_vs_{s}']:.2f}x faster per step (per repeat "
           f"{spreads[f'tencache_vs_{s}']['min']:.2f}-{spreads[f'tencache_vs_{s}']['max']:.2f})")
        for s in (k.removeprefix("tencache_vs_") for k in ratios)
        if s != "none"
    ) + f"   ({copies}; step ms: median (quartiles))"  # fmt: skip
    floor = result.get("link_floor")
    if floor is not None:
        t.caption += (
            f"\ntencache's busiest link ({floor['link']}) is busy {floor['busy_ms']:.0f} ms a "
            f"step, compute alone (none) takes {floor['compute_ms']:.0f} ms: "
            + (
                f"link-bound, copies can hide behind at most {floor['hideable_share']:.0%} of "
                "the link's time, so some accesses must wait whatever the order"
                if floor["link_bound"]
                else "compute-bound, every copy could be hidden"
            )
        )
    return t


def link_floor(ten: dict[str, Any], compute_ms: float) -> dict[str, Any] | None:
    """What the emulated link alone allows tencache (None without emulation): its
    busiest link's reserved time per step is a floor under the step whatever the
    prefetch order, and `none`'s step (compute alone) is all the copies can hide
    behind. Where the link's time exceeds the compute's (`link_bound`), some
    accesses must wait, and the hit rate says more about how many tensors the
    step touches than about the cache."""
    busy = ten.get("link_busy_ms_per_step") or {}
    if not busy or max(busy.values()) <= 0:
        return None
    name = max(busy, key=lambda k: busy[k])
    return {
        "link": name,
        "busy_ms": round(busy[name], 1),
        "compute_ms": round(compute_ms, 1),
        "link_bound": busy[name] > compute_ms,
        "hideable_share": round(min(1.0, compute_ms / busy[name]), 3),
    }


def loss_diff(losses: list[float], ref: list[float]) -> dict[str, float]:
    """How far `losses` are from `ref`, step for step: the largest absolute and
    relative difference, and the last step's absolute difference."""
    if len(losses) != len(ref) or not ref:
        raise ValueError(f"loss_diff: {len(losses)} losses against {len(ref)}")
    diffs = [abs(x - r) for x, r in zip(losses, ref, strict=True)]
    return {
        "max_abs": max(diffs),
        "max_rel": max(d / abs(r) if r else d for d, r in zip(diffs, ref, strict=True)),
        "last_abs": diffs[-1],
    }


def _block_ratios(other: dict[str, Any], ten: dict[str, Any]) -> list[float]:
    return [
        statistics.median(o) / statistics.median(t)
        for o, t in zip(other["step_ms_blocks"], ten["step_ms_blocks"], strict=True)
    ]


def _arch_result(
    a: BenchArgs, arch: str, root: Path, console: Console, link: dict[str, Any]
) -> dict[str, Any]:
    w = _workload(a, arch)
    load_before = os.getloadavg()[0]
    runs = _run(a, w, root / arch, console, link)
    chosen = _strategies(a)
    others = [s for s in chosen if s != "tencache"]  # what tencache is compared with
    result: dict[str, Any] = {s: runs[s] for s in chosen}
    result["strategies"] = list(chosen)
    result["model"] = _model_facts(a, w)
    # other processes' load, 1-minute average, before and after: on a shared
    # machine it moves every step time, and the ratios with them
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    ran = [s for s in chosen if "losses" in runs[s]]
    ref = runs["none"]["losses"]
    result["losses_identical_to_none"] = {s: runs[s]["losses"] == ref for s in ran}
    result["loss_diff_vs_none"] = {s: loss_diff(runs[s]["losses"], ref) for s in ran}
    t = runs["tencache"]["step_ms"]
    result["ratios"] = {  # None: that strategy could not start at this budget
        f"tencache_vs_{s}": round(runs[s]["step_ms"] / t, 3) if s in ran else None for s in others
    }
    if "step_ms_drained" in runs["tencache"]:  # --timing both: the previous accounting
        td = runs["tencache"]["step_ms_drained"]
        result["ratios_drained"] = {
            f"tencache_vs_{s}": round(runs[s]["step_ms_drained"] / td, 3) if s in ran else None
            for s in others
            if s not in DEEPSPEED_STRATEGIES  # timed continuously only
        }
    # the same ratio within each repeat (medians of its interleaved blocks): how
    # much it moves from one repeat to the next in the same process
    result["ratio_spread"] = {
        f"tencache_vs_{s}": spread(_block_ratios(runs[s], runs["tencache"]))
        for s in others
        if s in ran
    }
    floor = link_floor(runs["tencache"], runs["none"]["step_ms"])
    if floor is not None:
        result["link_floor"] = floor
    if "lru" in ran:  # tencache and none always ran
        result["calibration"] = _calibration(runs)
    result["profile"] = runs["profile"]
    return result


def main(argv: list[str]) -> int:
    a = _parse(argv)
    torch.set_num_threads(1)
    if _device_name(a) == "cuda":  # so every strategy's losses can equal `none`'s
        deterministic_cuda()  # DeepSpeed's steps relax it to warnings (`lenient`)
    console = Console(stderr=a.json == "-")
    if not console.is_terminal:  # a log file: the tables' full width
        console.width = 160
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
        "repeats": a.repeats,
        "timing_compared": a.timing,
        "timed_steps_per_strategy": a.steps * a.repeats,
        "warmup_steps": a.warmup,
        "timing": "per repeat and strategy one untimed lead-in step, then --steps steps "
        "each timed from the end of the one before; drained (untimed) after each block",
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
    exact = [  # DeepSpeed's own optimizer kernel: compared by size, not for equality
        same
        for x in archs
        for s, same in result[x]["losses_identical_to_none"].items()
        if s not in DEEPSPEED_STRATEGIES
    ]
    return 0 if all(exact) else 1
