"""`rltune bench placement`: MILP solve time and optimality on the real cluster.

The 1,213-node Alibaba cluster is filled by the pod list's own pods (first-fit,
in trace order) to each `--fills` share of its GPU capacity; the next pods of
the list, `--samples` windows of each size, are the waiting windows. Each window
is placed by the MILP as configured for production (time budget per call), and
again by an exact solve (same model, `--exact-limit` seconds, 2 workers) for
the gap; greedy (greedy.py: fastest type first, best fit) is scored with the same
objective beside it.

Per window size, JSON keys: window, solve_p50_ms, solve_p99_ms (wall time of a
whole place() call), gap_vs_exact (mean % below the exact objective),
gap_vs_exact_max, solve_cpu_p99_ms (CPU time of the process in the call: what the
wall time would be on an idle core), timeouts (calls that hit the budget before proving optimality;
they return the best solution found), fallbacks (calls with no solution: greedy
returned), milp_over_greedy (mean objective ratio), exact_optimal (exact solves
proven optimal), windows.

Plot (`--plot`, default placement.png): solve time by window size against the
budget, and the objective gap to the exact solve and the ratio to greedy.

    rltune bench placement [--windows 64,128,256] [--json -] [--plot placement.png]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from services.placement.baselines import first_fit_score, sequential_allocations
from services.placement.milp import MilpConfig, MilpPlacer
from services.placement.objective import Scorer
from services.placement.state import apply_allocations
from shared.cluster import load_cluster
from shared.errors import UserError
from shared.jsonfile import write_json
from shared.placement_api import FULL_GPU, JobRequest, NodeFree
from shared.sched.greedy import greedy_allocations
from shared.traces import SkipStats
from shared.traces.alibaba2023 import read_alibaba2023

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "alibaba-2023"


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def filled(
    nodes: list[NodeFree], pods: Sequence[JobRequest], share: float
) -> tuple[list[NodeFree], int]:
    """The cluster after first-fit of the list's pods until `share` of capacity has
    arrived, and the index of the first pod not used."""
    cap = sum(len(n.free_milli) for n in nodes) * FULL_GPU
    demand, i = 0, 0
    while demand < share * cap:
        demand += pods[i].num_gpus * pods[i].gpu_milli
        i += 1
    return apply_allocations(nodes, sequential_allocations(pods[:i], nodes, first_fit_score)), i


def measure_window(
    window: Sequence[JobRequest], nodes: list[NodeFree], cfg: MilpConfig, exact_s: float
) -> dict[str, float]:
    cpu0 = time.process_time()
    fast = MilpPlacer(cfg).place(window, nodes, {})
    cpu_ms = (time.process_time() - cpu0) * 1e3
    exact_cfg = MilpConfig(time_limit_s=exact_s, workers=2, weights=cfg.weights)
    exact = MilpPlacer(exact_cfg).place(window, nodes, {})
    ref = MilpPlacer(cfg).scorer(window, nodes, {})
    scorer = Scorer(window, nodes, {}, ref.weights, ref.workload, ref.pressure)
    greedy = scorer.evaluate(greedy_allocations(window, nodes))
    best = max(exact.objective or 0.0, fast.objective or 0.0)
    return {
        "ms": fast.solver_ms,
        "cpu_ms": cpu_ms,
        "gap": 100.0 * (best - (fast.objective or 0.0)) / best if best else 0.0,
        "timeout": float(fast.status != "OPTIMAL"),
        "fallback": float(fast.status == "FALLBACK_GREEDY"),
        "ratio": (fast.objective or 0.0) / greedy if greedy else 1.0,
        "exact_optimal": float(exact.status == "OPTIMAL"),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rltune bench placement", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(TRACES / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", default=str(TRACES / "openb_pod_list_gpuspec20.csv"))
    ap.add_argument("--windows", default="64,128,256")
    ap.add_argument("--fills", default="0.3,0.6,0.85", help="shares of capacity pre-filled")
    ap.add_argument("--samples", type=int, default=12, help="windows per size and fill")
    ap.add_argument("--time-limit", type=float, default=MilpConfig().time_limit_s)
    ap.add_argument("--exact-limit", type=float, default=10.0)
    ap.add_argument("--json", help="write the rows as JSON to this file ('-' = stdout)")
    ap.add_argument("--plot", default="placement.png", help="PNG of the table ('' = none)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(w) for w in args.windows.split(",")]
        fills = [float(f) for f in args.fills.split(",")]
    except ValueError as exc:
        raise UserError(f"--windows / --fills: {exc}") from None
    spec = load_cluster(args.nodes)
    empty = [NodeFree(n.node_id, n.gpu_type, (FULL_GPU,) * n.gpus) for n in spec.nodes]
    pods = [
        JobRequest(j.job_id, j.num_gpus, j.gpu_milli, frozenset(j.gpu_types))
        for j in read_alibaba2023(args.pods, SkipStats())
    ]
    cfg = MilpConfig(time_limit_s=args.time_limit)
    err = Console(stderr=True)
    states = [filled(empty, pods, f) for f in fills]
    MilpPlacer(cfg).place(pods[:32], empty, {})  # warm-up: first CP-SAT call loads the library
    rows = []
    with Progress(console=err, transient=True) as progress:
        for w in sizes:
            task = progress.add_task(f"window {w}", total=len(states) * args.samples)
            got: list[dict[str, float]] = []
            for nodes, start in states:
                for k in range(args.samples):
                    lo = (start + k * w) % max(len(pods) - w, 1)
                    got.append(measure_window(pods[lo : lo + w], nodes, cfg, args.exact_limit))
                    progress.advance(task)
            rows.append(_row(w, got))
    _report(rows, args, err)
    return 0


def _row(w: int, got: list[dict[str, float]]) -> dict[str, float]:
    ms = [g["ms"] for g in got]
    return {
        "window": w,
        "solve_p50_ms": round(_pct(ms, 0.5), 1),
        "solve_p99_ms": round(_pct(ms, 0.99), 1),
        "solve_cpu_p99_ms": round(_pct([g["cpu_ms"] for g in got], 0.99), 1),
        "gap_vs_exact": round(statistics.fmean(g["gap"] for g in got), 3),
        "gap_vs_exact_max": round(max(g["gap"] for g in got), 3),
        "timeouts": int(sum(g["timeout"] for g in got)),
        "fallbacks": int(sum(g["fallback"] for g in got)),
        "milp_over_greedy": round(statistics.fmean(g["ratio"] for g in got), 4),
        "exact_optimal": int(sum(g["exact_optimal"] for g in got)),
        "windows": len(got),
    }


def _report(rows: list[dict[str, float]], args: argparse.Namespace, err: Console) -> None:
    table = Table(title=f"MILP placement, 1,213 nodes, budget {args.time_limit * 1e3:.0f} ms")
    for key in rows[0]:
        table.add_column(key, justify="right")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    (err if args.json == "-" else Console()).print(table)
    if args.json:
        write_json(rows, args.json)
    if args.plot:
        plot(rows, Path(args.plot), args.time_limit)
        err.print(f"plot: {args.plot}")


def plot(rows: list[dict[str, float]], path: Path, budget_s: float) -> None:
    """Left: solve time (wall p50/p99, CPU p99) by window size, the budget dotted.
    Right: mean and max gap to the exact solve (%), and MILP / greedy objective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = [int(r["window"]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label, style in (
        ("solve_p50_ms", "wall p50", "o-"),
        ("solve_p99_ms", "wall p99", "s-"),
        ("solve_cpu_p99_ms", "CPU p99", "^--"),
    ):
        left.plot(ws, [r[key] for r in rows], style, label=label)
    left.axhline(budget_s * 1e3, color="grey", linestyle=":", label="time budget")
    left.set(xlabel="window (jobs)", ylabel="place() time (ms)", xticks=ws)
    left.set_title("MILP solve time")
    left.legend()
    left.grid(alpha=0.3)
    right.plot(ws, [r["gap_vs_exact"] for r in rows], "o-", label="gap to exact, mean")
    right.plot(ws, [r["gap_vs_exact_max"] for r in rows], "s--", label="gap to exact, max")
    right.set(xlabel="window (jobs)", ylabel="objective gap (%)", xticks=ws)
    twin = right.twinx()
    twin.plot(ws, [r["milp_over_greedy"] for r in rows], "^-", color="C2", label="MILP / greedy")
    twin.set_ylabel("MILP objective / greedy's")
    lines = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    right.legend(lines, [str(ln.get_label()) for ln in lines], loc="best")
    right.set_title("MILP objective against exact and greedy")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
