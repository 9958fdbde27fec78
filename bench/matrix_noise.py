"""How much of a policy matrix's ratios is noise (`rltune bench matrix_noise`).

A cell's avg bounded slowdown is a mean over a few thousand jobs whose heaviest terms
come from a few bursts, and EASY backfill passes a small change on: which job starts
first in one round decides which job a reservation blocks hours later. Before a 3%
difference between two policies on one cell means anything, it has to survive
perturbations that leave the workload as it was. This bench runs each cell of a matrix
file (`rltune eval --matrix`'s format) `--replicas` times:

* replica 0 is the cell as the matrix runs it;
* replica r > 0 delays each job's submission by U(0, `--jitter-s`) seconds, drawn from
  r (jobs submitted within seconds of each other are in no meaningful order), and
  with `--drop F` also leaves out a share F of the jobs, drawn the same way.

Every heuristic of the matrix runs on every replica (the cell's best is taken per
replica), with any `--policies` beside them. Printed per cell: each policy's avg
bounded slowdown over the best heuristic's, as the median and the range over the
replicas, which heuristic was best how often, and the ratio of the first two
`--policies` (`--pair`); across cells: each policy's geometric mean, per replica,
as the median and range.

    rltune bench matrix_noise [--matrix bench/matrices/validation.yaml]
        [--policies rl:models/rl-mixed.pt,f1-unicep] [--replicas 5] [--jitter-s 10]
        [--drop 0] [--placer milp] [--out DIR]

`--out` writes `noise.json` (every replica's ratios) and `noise.png` (each policy's
geometric mean per replica; and per cell the pair's ratio per replica).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rltune.matrix import HEURISTICS, Cell, _cell_jobs, geomean, load_matrix, ratios, run_cell
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.errors import UserError
from shared.jsonfile import write_json
from shared.traces import TraceJob

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "bench" / "matrices" / "validation.yaml"


def perturb(jobs: Sequence[TraceJob], replica: int, jitter_s: float, drop: float) -> list[TraceJob]:
    """`jobs` as replica `replica` runs them (module doc); replica 0: unchanged."""
    if replica == 0:
        return list(jobs)
    rng = np.random.default_rng([replica, 2026])
    delay = rng.uniform(0.0, jitter_s, len(jobs))
    keep = rng.random(len(jobs)) >= drop
    out = [
        dataclasses.replace(j, submit_s=j.submit_s + float(d))
        for j, d, k in zip(jobs, delay, keep, strict=True)
        if k
    ]
    out.sort(key=lambda j: j.submit_s)
    return out


def run_replica(
    cell: Cell, jobs: list[TraceJob], cluster: Any, policies: Sequence[str], placer: str
) -> dict[str, Any]:
    """The best heuristic and every policy's avg bsld ratio to it on one replica."""
    names = [*HEURISTICS, *(p for p in policies if p not in HEURISTICS)]
    r = ratios(run_cell(cell, cluster, jobs, names, placer))
    return {"best": r.best, "bsld": r.bsld}


def spread(values: Sequence[float]) -> str:
    """median [min-max], three decimals."""
    v = sorted(values)
    return f"{float(np.median(v)):.3f} [{v[0]:.3f}-{v[-1]:.3f}]"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="rltune bench matrix_noise", description=__doc__.splitlines()[0]
    )
    p.add_argument("--matrix", default=str(MATRIX))
    p.add_argument("--policies", default="rl:models/rl-mixed.pt,f1-unicep",
                   help="policies beside the heuristics; the first two are the --pair")  # fmt: skip
    p.add_argument("--replicas", type=int, default=5)
    p.add_argument("--jitter-s", type=float, default=10.0)
    p.add_argument("--drop", type=float, default=0.0)
    p.add_argument("--placer", default="milp")
    p.add_argument("--out", default=None, metavar="DIR")
    a = p.parse_args(argv)
    if a.replicas < 1:
        raise UserError(f"--replicas {a.replicas}: give 1 or more")
    if not (a.jitter_s >= 0 and math.isfinite(a.jitter_s)):
        raise UserError(f"--jitter-s {a.jitter_s}: give 0 or more seconds")
    if not 0.0 <= a.drop < 1.0:
        raise UserError(f"--drop {a.drop}: give a share from 0 to below 1")
    policies = [x for x in a.policies.split(",") if x]
    for name in policies:
        make_policy(name)  # a bad name fails before any run
    make_placer(a.placer, reproducible=True)
    shown = [*policies, *(h for h in HEURISTICS if h not in policies)]
    cells = load_matrix(a.matrix)
    runs: dict[str, list[dict[str, Any]]] = {}
    total = len(cells) * a.replicas
    for cell in cells:
        cluster, jobs = _cell_jobs(cell)
        runs[cell.name] = []
        for r in range(a.replicas):
            got = run_replica(
                cell, perturb(jobs, r, a.jitter_s, a.drop), cluster, policies, a.placer
            )
            runs[cell.name].append(got)
            done = sum(map(len, runs.values()))
            print(f"[{done}/{total}] {cell.name} replica {r}: best {got['best']}",
                  file=sys.stderr, flush=True)  # fmt: skip
    pair = policies[:2] if len(policies) >= 2 else []
    lines: list[str] = []
    say = lines.append
    say(f"Avg bounded slowdown / the replica's best heuristic, median [range] over "
        f"{a.replicas} replicas (jitter {a.jitter_s:g} s, drop {a.drop:g}):\n")  # fmt: skip
    head = ["cell", "best heuristic (replicas)", *shown]
    if pair:
        head.append(f"{pair[0]} / {pair[1]}")
    say("| " + " | ".join(head) + " |")
    say("|---|---|" + "---:|" * (len(head) - 2))
    for name, reps in runs.items():
        best = Counter(x["best"] for x in reps).most_common()
        row = [name, ", ".join(f"{b} {n}" for b, n in best)]
        row += [spread([x["bsld"][q] for x in reps]) if q in reps[0]["bsld"] else "n/a"
                for q in shown]  # fmt: skip
        if pair and all(q in reps[0]["bsld"] for q in pair):
            row.append(spread([x["bsld"][pair[0]] / x["bsld"][pair[1]] for x in reps]))
        say("| " + " | ".join(row) + " |")
    geo: dict[str, list[float]] = {}
    for q in shown:
        per = []
        for r in range(a.replicas):
            vals = [reps[r]["bsld"][q] for reps in runs.values() if q in reps[r]["bsld"]]
            if vals:
                per.append(geomean(vals))
        if per:
            geo[q] = per
    say("\nGeometric mean over the cells, per replica: median [range]\n")
    say("| policy | geo-mean bsld ratio |")
    say("|---|---:|")
    for q, per in geo.items():
        say(f"| {q} | {spread(per)} |")
    print("\n".join(lines))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        settings = {"replicas": a.replicas, "jitter_s": a.jitter_s, "drop": a.drop}
        shown_path = Path(a.matrix).resolve()
        matrix = str(shown_path.relative_to(ROOT) if shown_path.is_relative_to(ROOT) else a.matrix)
        write_json({"matrix": matrix, **settings, "placer": a.placer, "cells": runs,
                    "geomean": geo}, str(out / "noise.json"))  # fmt: skip
        _plot(runs, geo, pair, out / "noise.png")
        command = " ".join(["rltune bench matrix_noise", *argv])
        (out / "noise.md").write_text(f"`{command}`\n\n" + "\n".join(lines) + "\n")
    return 0


def _plot(
    runs: dict[str, list[dict[str, Any]]], geo: dict[str, list[float]], pair: list[str],
    path: Path,
) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, 2 if pair else 1, figsize=(14 if pair else 8, 0.35 * max(len(geo), len(runs)) + 2)
    )
    ax = axes[0] if pair else axes
    names = list(geo)
    for i, q in enumerate(names):
        ax.scatter(geo[q], [i] * len(geo[q]), color="tab:blue", s=14)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("geometric mean of avg bsld / best heuristic (one dot per replica)")
    if pair:
        ax = axes[1]
        cells = [c for c, reps in runs.items() if all(q in reps[0]["bsld"] for q in pair)]
        for i, c in enumerate(cells):
            vals = [x["bsld"][pair[0]] / x["bsld"][pair[1]] for x in runs[c]]
            ax.scatter(vals, [i] * len(vals), color="tab:orange", s=14)
        ax.set_yticks(range(len(cells)), cells)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xlabel(f"{pair[0]} / {pair[1]}, avg bsld (one dot per replica)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
