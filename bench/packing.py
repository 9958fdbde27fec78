"""`rltune bench packing`: the packing experiment of "Beware of Fragmentation" (ATC'23).

On the real 1,213-node Alibaba cluster, pods arrive in trace order (cycling
through the list) and never leave, until the GPU demand that has arrived
reaches 100% of the cluster's GPU capacity. A pod that fits nowhere is skipped
and counted. Reported per placer: GPU allocation ratio (allocated / capacity),
the unallocated share of arrived demand, and fragmentation at the end
(Σ_n F_n(M) of frag.py, M = the pod list's shapes, in GPUs and as a share of
the idle GPUs). first-fit, best-fit and fgd place one pod at a time; the MILP
places each window of arriving pods jointly (`--milp WINDOW:SECONDS,...`, one
row per setting, e.g. milp/256).

    rltune bench packing [--lists default,gpuspec20] [--milp 256:0.5,1024:3] [--json -] [--plot F]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from services.placement.baselines import (
    BestFitPlacer,
    FgdPlacer,
    first_fit_score,
    sequential_allocations,
)
from services.placement.frag import Workload, cluster_frag_milli
from services.placement.milp import MilpConfig, MilpPlacer
from services.placement.objective import ObjectiveWeights
from services.placement.state import apply_allocations
from shared.cluster import load_cluster
from shared.errors import UserError
from shared.jsonfile import write_json
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree, Placer
from shared.traces import SkipStats
from shared.traces.alibaba2023 import read_alibaba2023

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "alibaba-2023"
PLACERS = ("first-fit", "best-fit", "fgd", "milp")


@dataclass(frozen=True, slots=True)
class PackingRow:
    trace: str
    placer: str
    arrived: int  # pods that arrived
    skipped: int  # pods that fitted nowhere (or the MILP left out)
    alloc_ratio: float  # allocated GPU / cluster GPU capacity
    unallocated_share: float  # (arrived − allocated) demand / arrived demand
    frag_gpus: float  # Σ_n F_n(M) at the end, in GPUs
    frag_of_idle: float  # the same over the idle GPUs
    seconds: float
    curve: tuple[tuple[float, float], ...]  # (arrived demand, allocated) / capacity


def arrivals(pods: Sequence[JobRequest], capacity: int) -> list[JobRequest]:
    """Pods in order, cycling, until the arrived demand reaches `capacity` milli."""
    out: list[JobRequest] = []
    demand = 0
    while demand < capacity:
        p = pods[len(out) % len(pods)]
        out.append(JobRequest(f"{p.job_id}#{len(out)}", p.num_gpus, p.gpu_milli, p.gpu_types))
        demand += p.num_gpus * p.gpu_milli
    return out


def idle_floor(pods: Sequence[JobRequest], capacity: int) -> float:
    """A lower bound on the unallocated share (of capacity) for any placer that starts
    every pod it can: a pod of m > 500 milli holds a GPU alone with 1000 − m left,
    and a hole of at most h milli only takes pods of at most h milli, so
    idle >= Σ_{holes <= h} hole − Σ_{pods <= h milli} milli, for every h."""
    holes = sorted(FULL_GPU - p.gpu_milli for p in pods if 500 < p.gpu_milli < FULL_GPU)
    best = 0
    for h in sorted(set(holes)):
        fill = sum(p.gpu_milli for p in pods if p.gpu_milli <= h)
        best = max(best, sum(x for x in holes if x <= h) - fill)
    return best / capacity


def run(
    placer: str,
    pods: Sequence[JobRequest],
    nodes: list[NodeFree],
    workload: Workload,
    window: int,
    config: MilpConfig,
    progress: Progress,
) -> tuple[list[Allocation], float]:
    t0 = time.perf_counter()
    if placer == "first-fit":
        return sequential_allocations(pods, nodes, first_fit_score), time.perf_counter() - t0
    if placer in ("best-fit", "fgd"):
        p: Placer = BestFitPlacer() if placer == "best-fit" else FgdPlacer(workload)
        return list(p.place(pods, nodes, {}).allocations), time.perf_counter() - t0
    milp = MilpPlacer(config, workload=workload)
    task = progress.add_task(f"milp windows of {window}", total=len(pods))
    state, out = nodes, []
    for i in range(0, len(pods), window):
        chunk = pods[i : i + window]
        allocs = list(milp.place(chunk, state, {}).allocations)
        state = apply_allocations(state, allocs)
        out += allocs
        progress.advance(task, len(chunk))
    progress.remove_task(task)
    return out, time.perf_counter() - t0


def measure(
    trace: str,
    placer: str,
    pods: Sequence[JobRequest],
    nodes: list[NodeFree],
    allocs: Sequence[Allocation],
    workload: Workload,
    seconds: float,
) -> PackingRow:
    cap = sum(len(n.free_milli) for n in nodes) * FULL_GPU
    placed = {a.job_id for a in allocs}
    arrived = allocated = 0
    curve: list[tuple[float, float]] = []
    for i, p in enumerate(pods):
        arrived += p.num_gpus * p.gpu_milli
        allocated += p.num_gpus * p.gpu_milli if p.job_id in placed else 0
        if i % 50 == 0 or i == len(pods) - 1:
            curve.append((arrived / cap, allocated / cap))
    end = apply_allocations(nodes, allocs)
    frag = cluster_frag_milli(end, workload)
    idle = cap - allocated
    return PackingRow(
        trace,
        placer,
        len(pods),
        len(pods) - len(placed),
        allocated / cap,
        (arrived - allocated) / arrived,
        frag / FULL_GPU,
        frag / idle if idle else 0.0,
        seconds,
        tuple(curve),
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rltune bench packing", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(TRACES / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--lists", default="default,gpuspec20", help="openb_pod_list_<name>.csv names")
    ap.add_argument("--placers", default=",".join(PLACERS))
    ap.add_argument(
        "--milp",
        default="256:0.5,1024:3",
        help="MILP runs as WINDOW:SECONDS,...: pods placed jointly, time limit per window",
    )
    ap.add_argument("--frag-weight", type=float, default=1.0)
    ap.add_argument("--leftover-weight", type=float, default=0.0)
    ap.add_argument("--json", help="write rows as JSON to this file ('-' = stdout)")
    ap.add_argument("--plot", default="packing.png", help="PNG of allocation vs arrived demand")
    args = ap.parse_args(argv)
    placers = [p for p in args.placers.split(",") if p]
    if bad := [p for p in placers if p not in PLACERS]:
        raise UserError(f"unknown placer(s) {bad}; choose from {', '.join(PLACERS)}")
    weights = ObjectiveWeights(frag_weight=args.frag_weight, leftover_weight=args.leftover_weight)
    try:
        milps = [(int(w), float(t)) for w, t in (x.split(":") for x in args.milp.split(","))]
    except ValueError:
        raise UserError(f"--milp: expected WINDOW:SECONDS,... got {args.milp!r}") from None
    runs: list[tuple[str, int, MilpConfig]] = []  # (row label, window, MILP config)
    for p in placers:
        if p != "milp":
            runs.append((p, 0, MilpConfig()))
        for w, t in milps if p == "milp" else []:
            runs.append((f"milp/{w}", w, MilpConfig(time_limit_s=t, weights=weights)))
    spec = load_cluster(args.nodes)
    nodes = [NodeFree(n.node_id, n.gpu_type, (FULL_GPU,) * n.gpus) for n in spec.nodes]
    cap = sum(n.gpus for n in spec.nodes) * FULL_GPU
    rows: list[PackingRow] = []
    err = Console(stderr=True)
    with Progress(console=err, transient=True) as progress:
        for name in args.lists.split(","):
            path = Path(args.nodes).parent / f"openb_pod_list_{name}.csv"
            trace = [
                JobRequest(j.job_id, j.num_gpus, j.gpu_milli, frozenset(j.gpu_types))
                for j in read_alibaba2023(path, SkipStats())
            ]
            pods = arrivals(trace, cap)
            workload = Workload.of(trace)  # the paper's target workload: the list's shapes
            floor = idle_floor(pods, cap)
            err.print(f"{name}: any placer that starts every pod it can leaves >= {floor:.2%} idle")
            for label, window, config in runs:
                placer = label.split("/")[0]
                allocs, secs = run(placer, pods, nodes, workload, window, config, progress)
                rows.append(measure(name, label, pods, nodes, allocs, workload, secs))
                err.print(f"{name} {label}: {rows[-1].alloc_ratio:.2%} allocated in {secs:.1f} s")
    _report(rows, args, err)
    return 0


def _report(rows: list[PackingRow], args: argparse.Namespace, err: Console) -> None:
    table = Table(
        title="Packing on the 1,213-node Alibaba cluster (arrivals = 100% of GPU capacity)"
    )
    for col in (
        "pod list",
        "placer",
        "GPU allocation",
        "unallocated",
        "fragmentation",
        "frag / idle",
        "skipped",
        "time",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r.trace,
            r.placer,
            f"{r.alloc_ratio:.2%}",
            f"{r.unallocated_share:.2%}",
            f"{r.frag_gpus:.1f} GPUs",
            f"{r.frag_of_idle:.1%}",
            f"{r.skipped}/{r.arrived}",
            f"{r.seconds:.1f} s",
        )
    (err if args.json == "-" else Console()).print(table)
    if args.json:
        write_json([{k: v for k, v in asdict(r).items() if k != "curve"} for r in rows], args.json)
    if args.plot:
        _plot(rows, Path(args.plot))
        err.print(f"plot: {args.plot}")


def _plot(rows: list[PackingRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r.trace for r in rows))
    fig, axes = plt.subplots(1, len(traces), figsize=(6 * len(traces), 4.5), squeeze=False)
    for ax, trace in zip(axes[0], traces, strict=True):
        for r in rows:
            if r.trace == trace:
                xs, ys = zip(*r.curve, strict=True)
                ax.plot(
                    [100 * x for x in xs],
                    [100 * y for y in ys],
                    label=f"{r.placer} ({r.alloc_ratio:.1%})",
                )
        ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=0.8)
        ax.set(
            xlim=(80, 100),
            ylim=(80, 100),
            title=f"openb_pod_list_{trace}",
            xlabel="arrived GPU demand (% of capacity)",
            ylabel="allocated GPUs (% of capacity)",
        )
        ax.legend(loc="lower right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
