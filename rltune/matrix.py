"""The policy matrix (`rltune eval --matrix FILE --out DIR`, or `python -m
rltune.matrix FILE --out DIR`): `rl` and every non-clairvoyant heuristic on
each cell of a list of (trace, format, cluster, load, slice) cells; per cell the best
heuristic by average bounded slowdown and every policy's ratio to it (avg bounded
slowdown, avg JCT; utilisation as a difference in points), and across cells each
policy's geometric-mean ratio. Writes `matrix.md` (the tables), `matrix.csv` (one row
per cell and policy) and `matrix.png` (a heat map of the ratios) to DIR.

The matrix file is YAML or JSON: a list of cells, each

    name: thetagpu-last-3-weeks        # shown in the tables
    trace: ../shared/traces/alcf/thetagpu-2023-jan-apr.csv   # relative to the file
    format: alcf
    cluster: clusters/thetagpu.yaml    # relative to the file; swf: may be omitted
    since: 2023-04-09                  # optional, as `simulate --since` / `--until`
    until: ...
    fraction: [0.7, 1.0]               # optional: that part of the jobs, by submit order
    limit: 3000                        # optional: the first N of the slice
    load: 0.9                          # optional: arrivals compressed as `--load`
    load_basis: span                   # optional (offered, the default, or span)

Every cell is simulated with EASY backfill and the same placer (`--placer`, default
milp, as `simulate`'s). A policy that needs a field the cell's trace lacks (`sjf-req` without
requested times) is shown as n/a there and left out of that cell's ratios and of its
own geometric mean's cells (the count of cells is in the table).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.errors import UserError
from shared.listfile import trace_entries

__all__ = ["HEURISTICS", "Cell", "load_matrix", "main", "run_cell", "run_matrix"]

# every heuristic that never reads a true run time (las is fifo without preemption;
# random is no heuristic anyone would choose)
HEURISTICS = ("fifo", "sjf-est", "sjf-req", "smallest", "f1", "wfp3", "unicep",
              "f1-unicep", "multifactor", "drf")  # fmt: skip
_KEYS = {"name", "trace", "format", "cluster", "since", "until", "fraction", "limit", "load",
         "load_basis"}  # fmt: skip


@dataclass(frozen=True)
class Cell:
    name: str
    trace: Path
    format: str
    cluster: Path | None = None
    since: str = ""
    until: str = ""
    fraction: tuple[float, float] = (0.0, 1.0)
    limit: int | None = None
    load: float | None = None
    load_basis: str = "offered"


@dataclass
class CellResult:
    cell: Cell
    jobs: int
    gpus: int
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)  # policy -> summary
    missing: dict[str, str] = field(default_factory=dict)  # policy -> why not run
    wall_s: float = 0.0


def load_matrix(path: str | Path) -> list[Cell]:
    """The cells of a matrix file; UserError naming the cell and key if malformed."""
    p = Path(path)
    cells = []
    for i, (where, c) in enumerate(trace_entries(p, "matrix", "cell", _KEYS)):
        frac = c.get("fraction", [0.0, 1.0])
        if (
            not isinstance(frac, list)
            or len(frac) != 2
            or not all(isinstance(x, int | float) for x in frac)
            or not 0.0 <= frac[0] < frac[1] <= 1.0
        ):
            raise UserError(f"{where}: `fraction` must be [from, to] with 0 <= from < to <= 1")
        limit = c.get("limit")
        if limit is not None and (not isinstance(limit, int) or limit <= 0):
            raise UserError(f"{where}: `limit` must be a positive whole number")
        load = c.get("load")
        if load is not None and (not isinstance(load, int | float) or not 0 < load < math.inf):
            raise UserError(f"{where}: `load` must be a positive number")
        cluster = c.get("cluster")
        cells.append(
            Cell(
                name=str(c.get("name") or f"cell{i + 1}"),
                trace=p.parent / c["trace"],
                format=c["format"],
                cluster=None if cluster is None else p.parent / str(cluster),
                since=str(c.get("since") or ""),
                until=str(c.get("until") or ""),
                fraction=(float(frac[0]), float(frac[1])),
                limit=limit,
                load=None if load is None else float(load),
                load_basis=str(c.get("load_basis") or "offered"),
            )
        )
    names = [c.name for c in cells]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"matrix file {p}: cell name {twice[0]!r} used twice")
    return cells


def _cell_jobs(cell: Cell) -> tuple[Any, list[Any]]:
    """(cluster, the cell's jobs: sliced, limited, compressed to its load)."""
    from shared.cluster import load_cluster
    from shared.sim import load_jobs
    from shared.sim.load import compress_to_load
    from shared.traces import SkipStats
    from shared.traces._io import parse_time

    if cell.cluster is None:
        if cell.format != "swf":
            raise UserError(f"cell {cell.name}: `cluster` is required for format {cell.format}")
        from shared.traces.swf import swf_cluster

        cluster = swf_cluster(cell.trace)
    else:
        cluster = load_cluster(cell.cluster)
    jobs = load_jobs(cell.trace, cell.format, cluster, SkipStats())
    try:
        since = parse_time(cell.since) if cell.since else -math.inf
        until = parse_time(cell.until) if cell.until else math.inf
    except ValueError:
        raise UserError(f"cell {cell.name}: since/until: give YYYY-MM-DD[ HH:MM:SS]") from None
    jobs = [j for j in jobs if since <= j.submit_s < until]
    lo, hi = (round(f * len(jobs)) for f in cell.fraction)
    jobs = jobs[lo:hi][: cell.limit]
    if not jobs:
        raise UserError(f"cell {cell.name}: no job in its slice")
    if cell.load is not None:
        jobs, _ = compress_to_load(jobs, cluster, cell.load, cell.load_basis)
    return cluster, jobs


def run_cell(
    cell: Cell, cluster: Any, jobs: list[Any], policies: list[str], placer: str = "milp",
    seed: int = 0,
) -> CellResult:  # fmt: skip
    """Each of `policies` on `jobs` (a cell's, or a perturbed copy of them): EASY
    backfill, `placer`; a policy that needs a field no job carries is left out, with
    why, in `missing`."""
    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy
    from shared.sim import SimConfig, simulate
    from shared.traces import lacking_fields

    res = CellResult(cell, len(jobs), cluster.total_gpus)
    for name in policies:
        policy = make_policy(name)
        lacking = lacking_fields(getattr(policy, "needs", ()), jobs)
        if lacking:
            res.missing[name] = f"needs {', '.join(lacking)}"
            continue
        result = simulate(
            jobs, cluster, policy, make_placer(placer, reproducible=True),
            SimConfig(seed=seed, discipline="easy"),
        )  # fmt: skip
        res.summaries[name] = result.summary()
    return res


def run_matrix(
    cells: list[Cell], policies: list[str], placer: str = "milp", seed: int = 0
) -> list[CellResult]:
    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy

    make_placer(placer, reproducible=True)  # a bad name fails before any run
    for name in policies:
        make_policy(name)
    out = []
    for cell in cells:
        t0 = time.perf_counter()
        cluster, jobs = _cell_jobs(cell)
        res = run_cell(cell, cluster, jobs, policies, placer, seed)
        res.wall_s = time.perf_counter() - t0
        print(f"{cell.name}: {len(jobs)} jobs, {len(res.summaries)} policies, "
              f"{res.wall_s:.1f} s", file=sys.stderr)  # fmt: skip
        out.append(res)
    return out


def largest_max_wait(summary: dict[str, Any]) -> float:
    """The longest wait of a job of the largest size class that has jobs (s)."""
    buckets = [b for b in (summary.get("queue_by_size") or {}).values() if b.get("jobs")]
    return float(buckets[-1]["max_s"]) if buckets else math.nan


@dataclass
class Ratios:
    best: str  # the cell's best heuristic by avg bounded slowdown
    bsld: dict[str, float]
    jct: dict[str, float]
    util_pts: dict[str, float]  # utilisation minus the best heuristic's, in points


def ratios(res: CellResult, heuristics: tuple[str, ...] = HEURISTICS) -> Ratios:
    ran = {p: s for p, s in res.summaries.items() if _finite(s.get("avg_bsld"))}
    heur = {p: s for p, s in ran.items() if p in heuristics}
    if not heur:
        raise UserError(f"cell {res.cell.name}: no heuristic finished a job")
    best = min(heur, key=lambda p: (heur[p]["avg_bsld"], heuristics.index(p)))
    b = heur[best]
    return Ratios(
        best,
        {p: s["avg_bsld"] / b["avg_bsld"] for p, s in ran.items()},
        {p: s["avg_jct_s"] / b["avg_jct_s"] for p, s in ran.items()},
        {p: 100.0 * (s["gpu_util"] - b["gpu_util"]) for p, s in ran.items()},
    )


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def report(results: list[CellResult], policies: list[str], out: Path, command: str) -> str:
    """Write matrix.md, matrix.csv and matrix.png to `out`; the markdown."""
    rs = [ratios(r) for r in results]
    lines = [f"`{command}`", ""]
    lines += ["| cell | jobs | GPUs | best heuristic | its avg bsld | "
              + " | ".join(policies) + " |"]  # fmt: skip
    lines += ["|---|---:|---:|---|---:|" + "---:|" * len(policies)]
    for res, r in zip(results, rs, strict=True):
        row = [res.cell.name, str(res.jobs), str(res.gpus), r.best,
               f"{res.summaries[r.best]['avg_bsld']:.3f}"]  # fmt: skip
        row += [f"{r.bsld[p]:.3f}" if p in r.bsld else "n/a" for p in policies]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Geometric mean over the cells of each policy's avg bounded slowdown / the "
              "cell's best heuristic's (lower is better; 1.000 = as good as the best "
              "heuristic of every cell), with avg JCT the same way and utilisation as the "
              "mean difference in points:", ""]  # fmt: skip
    lines += [
        "| policy | cells | geo-mean bsld ratio | geo-mean JCT ratio | util (pts) | "
        "cells best or tied | worst bsld ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in policies:
        b = [r.bsld[p] for r in rs if p in r.bsld]
        if not b:
            lines.append(f"| {p} | 0 | n/a | n/a | n/a | 0 | n/a |")
            continue
        j = [r.jct[p] for r in rs if p in r.jct]
        u = [r.util_pts[p] for r in rs if p in r.util_pts]
        wins = sum(1 for x in b if x <= 1.0 + 1e-9)
        lines.append(
            f"| {p} | {len(b)} | {geomean(b):.3f} | {geomean(j):.3f} | "
            f"{sum(u) / len(u):+.2f} | {wins} | {max(b):.3f} |"
        )
    lines += ["", "Largest jobs' longest wait (s; the largest size class with jobs) against "
              "EASY `fifo`'s:", ""]  # fmt: skip
    lines += ["| cell | fifo | " + " | ".join(p for p in policies if p != "fifo") + " |"]
    lines += ["|---|---:|" + "---:|" * (len(policies) - 1)]
    for res in results:
        row = [res.cell.name]
        for p in ["fifo", *(p for p in policies if p != "fifo")]:
            s = res.summaries.get(p)
            row.append(f"{largest_max_wait(s):.0f}" if s else "n/a")
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    (out / "matrix.md").write_text(text)
    with (out / "matrix.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["cell", "jobs", "gpus", "policy", "avg_bsld", "avg_jct_s", "gpu_util",
                    "bsld_ratio", "jct_ratio", "util_pts", "best_heuristic",
                    "largest_max_wait_s"])  # fmt: skip
        for res, r in zip(results, rs, strict=True):
            for p in policies:
                s = res.summaries.get(p)
                if s is None:
                    w.writerow([res.cell.name, res.jobs, res.gpus, p, *[""] * 6, r.best, ""])
                    continue
                w.writerow([res.cell.name, res.jobs, res.gpus, p, s["avg_bsld"], s["avg_jct_s"],
                            s["gpu_util"], r.bsld.get(p, ""), r.jct.get(p, ""),
                            r.util_pts.get(p, ""), r.best, largest_max_wait(s)])  # fmt: skip
    heat_map(results, rs, policies, out / "matrix.png")
    return text


def heat_map(results: list[CellResult], rs: list[Ratios], policies: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = np.array([[r.bsld.get(p, np.nan) for p in policies] for r in rs], dtype=float)
    geo = [geomean([r.bsld[p] for r in rs if p in r.bsld]) for p in policies]
    data = np.vstack([data, geo])
    rows = [r.cell.name for r in results] + ["geo-mean"]
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(policies), 1.2 + 0.45 * len(rows)))
    shown = np.log2(np.clip(data, 0.25, 4.0))
    im = ax.imshow(np.ma.masked_invalid(shown), cmap="RdYlGn_r", vmin=-1.0, vmax=1.0,
                   aspect="auto")  # fmt: skip
    ax.set_xticks(range(len(policies)), policies, rotation=45, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            text = "n/a" if np.isnan(data[i, j]) else f"{data[i, j]:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
    ax.axhline(len(rows) - 1.5, color="black", linewidth=1.0)
    ax.set_title("avg bounded slowdown / the cell's best heuristic's (lower is better)",
                 fontsize=9)  # fmt: skip
    cbar = fig.colorbar(im, ax=ax, fraction=0.03)
    cbar.set_ticks([-1.0, 0.0, 1.0], labels=["0.5x", "1x", "2x"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None, prog: str = "python -m rltune.matrix") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("matrix", help="matrix file (YAML or JSON list of cells)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--policies", default="", help="comma-separated (default: rl and every "
                   "heuristic: " + ",".join(HEURISTICS) + ")")  # fmt: skip
    p.add_argument("--placer", default="milp")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return matrix_command(args.matrix, args.out, args.policies, args.placer, args.seed)


def matrix_command(matrix: str, out: str, policies: str, placer: str, seed: int) -> int:
    """What `rltune eval --matrix` and `python -m rltune.matrix` run."""
    from rltune.common import out_dir

    names = [n.strip() for n in policies.split(",") if n.strip()] or ["rl", *HEURISTICS]
    cells = load_matrix(matrix)
    where = out_dir(out)
    results = run_matrix(cells, names, placer, seed)
    cmd = " ".join(["rltune", *sys.argv[1:]]) if sys.argv[1:2] == ["eval"] else (
        f"rltune eval --matrix {matrix} --out {out}")  # fmt: skip
    sys.stdout.write(report(results, names, where, cmd))
    print(f"wrote {where / 'matrix.md'}, matrix.csv, matrix.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
