"""`python -m bench.offload_runs OUT.png RUN.json [RUN.json ...]`: tencache's
speed-up over `lru` and `fixed` per architecture across several
`rltune bench offload --json` runs, as a plot and a table.

Each run is a point per architecture (the ratio of median steps) with a bar
over its per-repeat range (`ratio_spread`: the same ratio within each
interleaved repeat), the runs side by side, and a line at the 1.5x target;
the 1-minute load average of each run is in the legend (the ratios move
with it on a shared machine). The table (stdout, markdown) has the same
figures. Runs from before the per-repeat accounting (no `ratio_spread`) are
plotted without bars.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main", "ratios"]

TARGET = 1.5
BASES = ("lru", "fixed")


def ratios(run: dict[str, Any]) -> dict[str, dict[str, tuple[float, float, float] | None]]:
    """Per architecture and baseline (`lru`, `fixed`): (ratio, lowest and highest
    per-repeat ratio), or None where the baseline could not start."""
    out: dict[str, dict[str, tuple[float, float, float] | None]] = {}
    for arch, r in run.items():
        if arch == "settings" or "ratios" not in r:
            continue
        out[arch] = {}
        for base in ("lru", "fixed"):
            key = f"tencache_vs_{base}"
            v = r["ratios"].get(key)
            if v is None:
                out[arch][base] = None
                continue
            spread = r.get("ratio_spread", {}).get(key)
            lo, hi = (spread["min"], spread["max"]) if spread else (v, v)
            out[arch][base] = (v, lo, hi)
    return out


def _cell(got: tuple[float, float, float] | None) -> str:
    return "–" if got is None else f"{got[0]:.2f} ({got[1]:.2f}–{got[2]:.2f})"


def _load(run: dict[str, Any]) -> str:
    loads = [x for r in run.values() if isinstance(r, dict) for x in r.get("load_average", [])]
    return f"load {min(loads):.0f}-{max(loads):.0f}" if loads else "load not recorded"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(
            "usage: python -m bench.offload_runs OUT.png RUN.json [RUN.json ...]", file=sys.stderr
        )
        return 2
    out, paths = Path(argv[0]), [Path(p) for p in argv[1:]]
    try:
        runs = [json.loads(p.read_text()) for p in paths]
    except (OSError, ValueError) as exc:
        print(f"python -m bench.offload_runs: {exc}", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_run = [ratios(r) for r in runs]
    archs = list(dict.fromkeys(a for r in per_run for a in r))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    width = 0.8 / max(1, len(runs))
    print("| architecture | " + " | ".join(f"× lru, × fixed: {p.name}" for p in paths) + " |")
    print("|---|" + "---|" * len(paths))
    for ax, base in zip(axes, ("lru", "fixed"), strict=True):
        for k, (rs, run, path) in enumerate(zip(per_run, runs, paths, strict=True)):
            xs, ys, lo, hi = [], [], [], []
            for i, arch in enumerate(archs):
                got = rs.get(arch, {}).get(base)
                if got is None:
                    continue
                xs.append(i - 0.4 + (k + 0.5) * width)
                ys.append(got[0])
                lo.append(got[0] - got[1])
                hi.append(got[2] - got[0])
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3,
                        label=f"{path.stem} ({_load(run)})")  # fmt: skip
        ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1)
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_xticks(range(len(archs)), archs, rotation=30)
        ax.set_title(f"tencache step speed-up over {base} (bar: range over repeats)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("median step of baseline / of tencache")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    for arch in archs:
        cells = [
            ", ".join(_cell(rs.get(arch, {}).get(b)) for b in ("lru", "fixed")) for rs in per_run
        ]
        print(f"| {arch} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
