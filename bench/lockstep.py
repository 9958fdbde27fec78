"""`rltune bench lockstep`: the streaming system against the in-process simulator.

    rltune bench lockstep [--limit 2000] [--policies fifo,sjf-est] [--placer milp]
                          [--discipline easy] [--scale 0.125] [--out DIR]

For each policy, the first `--limit` Philly jobs run twice on the same cluster
(philly.yaml with every node count scaled by `--scale`, so that jobs queue):
`rltune simulate` in this process, and `rltune up --lockstep --until-done`
(the embedded broker and every service as its own process, the rounds over
Kafka). It prints, per policy, how many jobs start at exactly the same time on
the same GPUs, the largest start-time difference, and each run's wall time, and
plots the start times of one against the other (`DIR/lockstep.png`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from rltune import main as rltune
from shared.sim import read_jobs_csv

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "philly" / "philly-sep-oct.csv"


def scaled_cluster(scale: float, out: Path) -> Path:
    spec = yaml.safe_load((ROOT / "clusters" / "philly.yaml").read_text())
    spec["name"] = f"philly-x{scale:g}"
    for group in spec["nodes"]:
        group["count"] = max(1, round(group["count"] * scale))
    path = out / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rltune bench lockstep", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--format", default="philly")
    p.add_argument("--limit", type=int, default=2000)
    p.add_argument("--policies", default="fifo,sjf-est")
    p.add_argument("--placer", default="milp")
    p.add_argument("--discipline", default="easy")
    p.add_argument("--scale", type=float, default=0.125, help="node counts x this")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="rltune-lockstep-"))
    out.mkdir(parents=True, exist_ok=True)
    err = Console(stderr=True)
    cluster = scaled_cluster(args.scale, out)
    common = ["--trace", args.trace, "--format", args.format, "--cluster", str(cluster)]
    common += ["--placer", args.placer, "--limit", str(args.limit)]
    name = yaml.safe_load(cluster.read_text())["name"]
    table = Table(title=f"{args.limit} jobs, {name} ({args.placer}, {args.discipline})")
    for col in ("policy", "jobs", "same start", "same GPUs", "max |Δstart| s", "queued"):
        table.add_column(col)
    table.add_column("simulate s")
    table.add_column("up --lockstep s")
    pairs = {}
    for policy in args.policies.split(","):
        sim_csv, up_csv = out / f"{policy}.simulate.csv", out / f"{policy}.up.csv"
        err.print(f"{policy}: rltune simulate ...")
        t0 = time.perf_counter()
        argv_sim = ["simulate", *common, "--policy", policy, "--discipline", args.discipline]
        rltune([*argv_sim, "--jobs-out", str(sim_csv), "--json", str(out / f"{policy}.sim.json")])
        sim_s = time.perf_counter() - t0
        err.print(f"{policy}: rltune up --lockstep --until-done ... (logs in {out})")
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "rltune", "up", *common, "--policy", policy]
        cmd += ["--lockstep", "--until-done", "--jobs-out", str(up_csv), "--logs", str(out)]
        cmd += ["--json", str(out / f"{policy}.up.json"), "--discipline", args.discipline]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        up_s = time.perf_counter() - t0
        a = {r.job_id: r for r in read_jobs_csv(sim_csv)}
        b = {r.job_id: r for r in read_jobs_csv(up_csv)}
        same = sum(1 for j, r in a.items() if j in b and _start(r) == _start(b[j]))
        gpus = sum(1 for j, r in a.items() if j in b and r.segments == b[j].segments)
        diff = max((abs(_start(r) - _start(b[j])) for j, r in a.items() if j in b), default=0.0)
        queued = sum(1 for r in a.values() if r.segments and _start(r) > r.submit_s)
        table.add_row(
            policy, str(len(a)), str(same), str(gpus), f"{diff:g}", str(queued),
            f"{sim_s:.1f}", f"{up_s:.1f}",
        )  # fmt: skip
        pairs[policy] = [(_start(r), _start(b[j])) for j, r in a.items() if j in b]
    Console().print(table)
    _plot(pairs, out / "lockstep.png")
    err.print(f"plot: {out / 'lockstep.png'}")
    return 0


def _start(rec: object) -> float:
    segs = getattr(rec, "segments", ())
    return segs[0].start_s if segs else -1.0


def _plot(pairs: dict[str, list[tuple[float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 4.5), squeeze=False)
    for ax, (policy, xy) in zip(axes[0], pairs.items(), strict=True):
        xs = [x / 86400 for x, _ in xy]
        ys = [y / 86400 for _, y in xy]
        ax.scatter(xs, ys, s=4)
        ax.set_title(f"{policy}: start time per job")
        ax.set_xlabel("rltune simulate (days)")
        ax.set_ylabel("rltune up --lockstep (days)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
