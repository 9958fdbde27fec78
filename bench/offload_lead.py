"""`python -m bench.offload_lead [--archs llama] [--link-gbps none|auto|PCIE,NVME]
[--variants lru,before,default] [--json OUT]`: how much prefetch lead a
10Cache plan should buy, and what its mechanisms are worth, side by side in
one process.

Tencache engines per architecture, same seed, same batches, timed as
`rltune bench offload` times them (interleaved repeats of a lead-in and
`--steps` timed steps, each from the end of the one before; its settings
and helpers): the plan's
buffers sized for the planner's chosen lead (`--window` 8, shrunk to the 90%
streaming share) or for a lead of one or none, and at run time either only
that lead or up to 8 fetches ahead (`PREFETCH_AHEAD`, the engine's default);
the default once more with write-behind (a changed tensor goes home as soon
as it is released, not when its buffer is next taken), once without sliced
optimizer states (every state whole), and once as the default was before
both (`before`: whole states, write-behind); `lru` beside them, for the
ratio, `lru` with sliced states (what slicing alone gives naive offload)
and `none`. Past its tensors, the run-time lead also fills `lead_bytes`
(the engine's default: an eighth of the fast budget) within 256 accesses,
except in `count-lead` (the previous default: 8 tensors within 64 accesses,
nothing in bytes), `before`, `lead-only` and `no-prefetch`.
`share-0.7` and `share-0.5` plan with that streaming share (`build_plan`'s
`stream_share`, default 0.9): fewer streaming buffers, more residents.
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
from dataclasses import asdict
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
    _workload,
    interleaved,
    spread,
)
from offload_agent.engine import OffloadEngine
from shared.errors import UserError
from shared.jsonfile import write_json
from shared.offload.planner import build_plan
from shared.offload.policies import COUNT_LOOKAHEAD, LOOKAHEAD, PREFETCH_AHEAD, PlanPolicy

__all__ = ["main"]

# key: (name, strategy, window the buffers are sized for, fetches ahead at run
# time at least, write-behind, sliced AdamW states: None = the engine's default)
VARIANTS = {
    "none": ("none (everything in the fast tier)", "none", 0, 0, False, None),
    "lru": ("lru (reference)", "lru", 0, 0, False, None),
    "no-prefetch": ("no prefetch (lead 0, ahead 0)", "tencache", 0, 0, False, None),
    "lead-only": ("planner's lead only", "tencache", 8, 0, False, None),
    "default": (
        f"planner's lead, ahead {PREFETCH_AHEAD} (default)",
        "tencache",
        8,
        PREFETCH_AHEAD,
        False,
        None,
    ),
    "write-behind": ("default with write-behind", "tencache", 8, PREFETCH_AHEAD, True, None),
    "lead-1": (
        f"sized for lead 1, ahead {PREFETCH_AHEAD}",
        "tencache",
        1,
        PREFETCH_AHEAD,
        False,
        None,
    ),
    "no-slicing": (
        "default, whole states (no slicing)",
        "tencache",
        8,
        PREFETCH_AHEAD,
        False,
        False,
    ),
    "before": (  # the default until sliced states: whole states, write-behind
        "whole states, write-behind (the old default)",
        "tencache",
        8,
        PREFETCH_AHEAD,
        True,
        False,
    ),
    "lru-sliced": ("lru with sliced states", "lru", 0, 0, False, True),
    "count-lead": (  # the default until the lead counted bytes
        f"lead in tensors only (ahead {PREFETCH_AHEAD})",
        "tencache",
        8,
        PREFETCH_AHEAD,
        False,
        None,
    ),
    "share-0.7": ("default, streaming share 0.7", "tencache", 8, PREFETCH_AHEAD, False, None),
    "share-0.5": ("default, streaming share 0.5", "tencache", 8, PREFETCH_AHEAD, False, None),
}
# the most of the fast budget the plan's streaming buffers may take (`build_plan`'s
# `stream_share`; the rest keeps tensors resident); others: the default, 0.9
SHARES = {"share-0.7": 0.7, "share-0.5": 0.5}
# variants whose run-time lead counts tensors only, within COUNT_LOOKAHEAD
# accesses (the engine's rule before the lead in bytes)
COUNT_ONLY = {"count-lead", "before", "lead-only", "no-prefetch"}


def _arch(
    arch: str,
    a: BenchArgs,
    link: dict[str, Any],
    root: Path,
    console: Console,
    variants: list[str],
) -> dict[str, Any]:
    w = _workload(a, arch)
    out: dict[str, Any] = {}

    def after(v: str, e: OffloadEngine) -> None:
        if not e.profile_ready:
            return
        _name, _strategy, window, ahead, behind, _sliced = VARIANTS[v]
        share = SHARES.get(v, BenchArgs.stream_share)
        plan = build_plan(e.profile(), e.budgets, window=window, stream_share=share)
        if not e.apply_plan(plan):
            raise RuntimeError(f"plan refused: {e.last_error}")
        assert e.cache is not None
        count = v in COUNT_ONLY
        e.cache.policy = PlanPolicy(
            plan.prefetch,
            plan.window,
            ahead=ahead,
            write_behind=behind,
            lead_bytes=None if count else e.config.prefetch_lead_bytes(),
            lookahead=COUNT_LOOKAHEAD if count else LOOKAHEAD,
        )

    with ThreadPoolExecutor(a.io_threads, thread_name_prefix="offload-io") as io:
        engines = {
            v: _engine(a, w, VARIANTS[v][1], root / arch / str(i), io, dict(link), VARIANTS[v][5])
            for i, v in enumerate(variants)
        }
        with Progress(console=console, transient=True) as progress:
            total = (a.warmup + a.repeats * (a.steps + 1)) * len(engines)
            task = progress.add_task(arch, total=total)
            measured = interleaved(engines, w, a, after, lambda: progress.advance(task))
        times = {v: measured[v].times for v in variants}
        losses = {v: [measured[v].losses[k] for k in sorted(measured[v].losses)] for v in variants}
        lru = statistics.median(times["lru"]) if "lru" in times else None
        for v, e in engines.items():
            assert e.cache is not None
            policy = e.cache.policy
            st, m = e.stats, measured[v]
            median = statistics.median(times[v])
            moved = m.bytes_moved / m.steps
            out[v] = {
                "name": VARIANTS[v][0],
                "step_ms": round(median, 1),
                "lru_over_this": round(lru / median, 3) if lru else None,
                "step_ms_spread": spread(times[v]),
                "copy_wait_ms": round(m.wait_ms / m.steps, 1),
                "fast_tier_hit_rate": round(m.hit_rate, 4),
                "bytes_moved_per_step": int(moved),
                "fast_overflow_bytes": st.overflow_bytes,
                "sliced_params": len(e.sliced),
                "plan_window": getattr(policy, "lead", policy.window),
                "losses": losses[v],
            }
            console.print(
                f"{arch:6s} {VARIANTS[v][0]:36s} lead {getattr(policy, 'lead', '-')} "
                f"ahead {policy.window}: step {median:.0f} ms"
                + (f" (lru / this {lru / median:.2f})" if lru else "")
                + f", copy wait {m.wait_ms / m.steps:.0f} ms, hit rate {m.hit_rate:.3f}, "
                f"{moved / 1e6:.0f} MB moved/step, {len(e.sliced)} sliced, "
                f"overflow {st.overflow_bytes} B"
            )
            e.close()
    out["losses_equal"] = len({tuple(x) for x in losses.values()}) == 1
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.offload_lead", description=__doc__)
    p.add_argument("--archs", default="llama")
    p.add_argument("--steps", type=int, default=BenchArgs.steps, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=BenchArgs.repeats)
    p.add_argument("--link-gbps", default="none", help="none, auto or PCIE,NVME in GB/s")
    p.add_argument("--fast-frac", type=float, default=BenchArgs.fast_frac)
    p.add_argument("--host-frac", type=float, default=BenchArgs.host_frac)
    for dim in ("dim", "layers", "vocab", "seq", "batch"):
        p.add_argument(f"--{dim}", type=int, default=getattr(BenchArgs, dim))
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)}")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    a = BenchArgs(
        archs=args.archs,
        steps=args.steps,
        repeats=args.repeats,
        link_gbps=args.link_gbps,
        fast_frac=args.fast_frac,
        host_frac=args.host_frac,
        dim=args.dim,
        layers=args.layers,
        vocab=args.vocab,
        seq=args.seq,
        batch=args.batch,
    )
    torch.set_num_threads(1)
    try:
        unknown = sorted(set(variants) - set(VARIANTS))
        if unknown:
            raise UserError(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
        if a.link_gbps not in ("none", "auto"):
            _explicit_rates(a.link_gbps)
        link = _link_rates(a)
    except UserError as exc:
        print(f"python -m bench.offload_lead: {exc}", file=sys.stderr)
        return 2
    console = Console()
    console.print(
        f"fast tier {a.fast_frac:.0%}, host {a.host_frac:.0%}; dim {a.dim}, layers {a.layers}, "
        f"vocab {a.vocab}, context {a.seq}, batch {a.batch}; {_describe_link(link)}"
    )
    root = Path(tempfile.mkdtemp(prefix="rltune-offload-lead-"))
    result: dict[str, Any] = {"settings": {**asdict(a), "link": link, "variants": variants}}
    try:
        for arch in args.archs.split(","):
            result[arch] = _arch(arch, a, link, root, console, variants)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        write_json(result, args.json)
    return 0 if all(result[x]["losses_equal"] for x in args.archs.split(",")) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
