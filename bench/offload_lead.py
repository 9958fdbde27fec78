"""`python -m bench.offload_lead [--archs llama] [--link-gbps none|auto|PCIE,NVME]`: how
much prefetch lead a 10Cache plan should buy, side by side in one process.

Tencache engines per architecture, same seed, same batches, round-robin
(the settings of `rltune bench offload`, whose helpers this uses): the plan's
buffers sized for the planner's chosen lead (`--window` 8, shrunk to the 90%
streaming share) or for a lead of one or none, and at run time either only
that lead or up to 8 fetches ahead (`PREFETCH_AHEAD`, the engine's default);
the default once more without write-behind (a changed tensor then goes home
only when its buffer is taken); and `lru` beside them, for the ratio.
Prints the median step, hit rate and bytes moved per variant; exits non-zero
unless every variant's losses are equal.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress

from bench.offload import (
    BenchArgs,
    _describe_link,
    _engine,
    _explicit_rates,
    _link_rates,
    _timed_step,
    _workload,
)
from offload_agent.policies import PREFETCH_AHEAD, PlanPolicy
from services.profiler.planner import build_plan
from shared.errors import UserError

__all__ = ["main"]

# name: (strategy, window the buffers are sized for, fetches ahead at run time
# at least, write-behind)
VARIANTS = {
    "lru (reference)": ("lru", 0, 0, False),
    "no prefetch (lead 0, ahead 0)": ("tencache", 0, 0, True),
    "planner's lead only": ("tencache", 8, 0, True),
    f"planner's lead, ahead {PREFETCH_AHEAD} (default)": ("tencache", 8, PREFETCH_AHEAD, True),
    "default without write-behind": ("tencache", 8, PREFETCH_AHEAD, False),
    f"sized for lead 1, ahead {PREFETCH_AHEAD}": ("tencache", 1, PREFETCH_AHEAD, True),
}


def _arch(arch: str, a: BenchArgs, link: dict[str, Any], root: Path, console: Console) -> bool:
    w = _workload(a, arch)
    losses: dict[str, list[float]] = {v: [] for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with ThreadPoolExecutor(a.io_threads, thread_name_prefix="offload-io") as io:
        engines = {
            v: _engine(a, w, VARIANTS[v][0], root / arch / str(i), io, dict(link))
            for i, v in enumerate(VARIANTS)
        }
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(arch, total=(a.warmup + a.steps) * len(engines))
            for step in range(a.warmup + a.steps):
                for v, e in engines.items():
                    _strategy, window, ahead, behind = VARIANTS[v]
                    if step == a.warmup:
                        e.stats.reset()
                    loss, ms, _cpu = _timed_step(e, w, step)
                    if e.profile_ready:
                        plan = build_plan(e.profile(), e.budgets, window=window)
                        if not e.apply_plan(plan):
                            raise RuntimeError(f"plan refused: {e.last_error}")
                        assert e.cache is not None
                        e.cache.policy = PlanPolicy(
                            plan.prefetch, plan.window, ahead=ahead, write_behind=behind
                        )
                    losses[v].append(loss)
                    if step >= a.warmup:
                        times[v].append(ms)
                    progress.advance(task)
        lru = statistics.median(times["lru (reference)"])
        for v, e in engines.items():
            assert e.cache is not None
            policy = e.cache.policy
            st = e.stats
            median = statistics.median(times[v])
            console.print(
                f"{arch:6s} {v:34s} lead {getattr(policy, 'lead', '-')} ahead {policy.window}: "
                f"step {median:.0f} ms (lru / this {lru / median:.2f}), "
                f"hit rate {st.hit_rate:.3f}, "
                f"{(st.bytes_in + st.bytes_out) / a.steps / 1e6:.0f} MB moved/step"
            )
            e.close()
    return len({tuple(x) for x in losses.values()}) == 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.offload_lead", description=__doc__)
    p.add_argument("--archs", default="llama")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--link-gbps", default="none", help="none, auto or PCIE,NVME in GB/s")
    p.add_argument("--fast-frac", type=float, default=BenchArgs.fast_frac)
    args = p.parse_args(argv)
    a = BenchArgs(steps=args.steps, link_gbps=args.link_gbps, fast_frac=args.fast_frac)
    torch.set_num_threads(1)
    try:
        if a.link_gbps not in ("none", "auto"):
            _explicit_rates(a.link_gbps)
        link = _link_rates(a)
    except UserError as exc:
        print(f"python -m bench.offload_lead: {exc}", file=sys.stderr)
        return 2
    console = Console()
    console.print(f"fast tier {a.fast_frac:.0%}, host {a.host_frac:.0%}; {_describe_link(link)}")
    root = Path(tempfile.mkdtemp(prefix="rltune-offload-lead-"))
    try:
        same = [_arch(arch, a, link, root, console) for arch in args.archs.split(",")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if all(same) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
