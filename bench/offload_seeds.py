"""`python -m bench.offload_seeds DIR [DIR ...] --out PLOT.png`: the offload placement
results of several marking seeds side by side, from the `offload_placement.json`
that `rltune bench offload_placement --out DIR` writes for each seed.

Printed (markdown): per seed, the migration slowdown of the offloading jobs under
each placer and each offload-aware placer's cut against `milp` (and `greedy+...`
against `greedy`), and avg JCT of the jobs that do not offload and of those that
do, with the change against the unaware twin; then the mean cut over the seeds.
The plot shows the cuts and the avg JCT changes per seed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shared.errors import UserError

__all__ = ["main", "rows"]


_KEYS = (
    ("slowdown", "offload_slowdown"),
    ("others", "others_avg_jct_s"),
    ("offloading", "offload_avg_jct_s"),
    ("all", "avg_jct_s"),
)


def _load(d: str) -> dict[str, Any]:
    path = Path(d) / "offload_placement.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from exc
    return data


def _seed(data: dict[str, Any]) -> str:
    marking = str(data.get("marking", ""))
    i = marking.find("(seed ")
    return marking[i + 6 : marking.index(")", i)] if i >= 0 else "?"


def _twin(name: str) -> str:
    return "greedy" if name.startswith("greedy") else "milp"


def rows(datas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (seed, placer): slowdown, cut vs the unaware twin, avg JCT of the
    jobs that do not offload and of those that do, and their change vs the twin."""
    out = []
    for data in datas:
        placers = data["placers"]
        for name, r in placers.items():
            base = placers.get(_twin(name))
            row = {
                "seed": _seed(data),
                "placer": name,
                "slowdown": r["offload_slowdown"],
                "others": r["others_avg_jct_s"],
                "offloading": r["offload_avg_jct_s"],
                "all": r["avg_jct_s"],
                "moves": r.get("replacements", 0),
            }
            if base is not None and base is not r:
                for k, key in _KEYS:
                    row[f"d_{k}"] = r[key] / base[key] - 1 if base[key] else 0.0
            out.append(row)
    return out


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:+.1%}"


def table(rs: list[dict[str, Any]]) -> str:
    lines = [
        "| seed | placer | slowdown | cut vs unaware | avg JCT s, not offloading | change "
        "| avg JCT s, offloading | change | avg JCT s, all | change | moves |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        lines.append(
            f"| {r['seed']} | `{r['placer']}` | {r['slowdown']:.3f} | {_pct(r.get('d_slowdown'))}"
            f" | {r['others']:.0f} | {_pct(r.get('d_others'))} | {r['offloading']:.0f}"
            f" | {_pct(r.get('d_offloading'))} | {r['all']:.0f} | {_pct(r.get('d_all'))}"
            f" | {r['moves']} |"
        )
    names = sorted({r["placer"] for r in rs if "d_slowdown" in r})
    for n in names:
        mine = [r for r in rs if r["placer"] == n]
        cuts = [-r["d_slowdown"] for r in mine]
        met = sum(
            1 for r in mine
            if -r["d_slowdown"] >= 0.30 and max(r["d_others"], r["d_offloading"]) <= 0
        )  # fmt: skip
        rises = sum(1 for r in mine if r["d_others"] > 0)
        lines.append(
            f"\n`{n}` vs `{_twin(n)}` over {len(mine)} seeds: mean cut {sum(cuts) / len(cuts):.1%}"
            f", smallest {min(cuts):.1%}; target (cut >= 30%, no group's avg JCT higher) met at"
            f" {met}; avg JCT of the jobs that do not offload higher at {rises}"
        )
    return "\n".join(lines)


def plot(rs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["placer"] for r in rs if "d_slowdown" in r})
    seeds = sorted({r["seed"] for r in rs}, key=lambda s: (len(s), s))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / max(len(names), 1)
    for k, (ax, key, title) in enumerate(
        zip(
            axes, ("d_slowdown", "d_others", "d_offloading"),
            ("migration slowdown vs unaware twin", "avg JCT, jobs not offloading, vs twin",
             "avg JCT, offloading jobs, vs twin"),
            strict=True,
        )
    ):  # fmt: skip
        for i, n in enumerate(names):
            by = {r["seed"]: r for r in rs if r["placer"] == n}
            xs = [j + i * width for j in range(len(seeds))]
            ax.bar(xs, [100 * by[s].get(key, 0.0) if s in by else 0 for s in seeds], width,
                   label=n)  # fmt: skip
        ax.axhline(0, color="black", linewidth=0.8)
        if k == 0:
            ax.axhline(-30, color="red", linestyle="--", linewidth=0.8, label="-30% target")
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(seeds))], seeds)
        ax.set_xlabel("marking seed")
        ax.set_ylabel("%")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.offload_seeds", description=__doc__)
    p.add_argument("dirs", nargs="+", help="--out directories of offload_placement runs")
    p.add_argument("--out", default=None, help="plot path (PNG)")
    a = p.parse_args(argv)
    try:
        rs = rows([_load(d) for d in a.dirs])
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table(rs))
    if a.out:
        plot(rs, Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
