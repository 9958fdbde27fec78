"""`rltune bench sim_identity`: per-job CSVs of `rltune simulate` on a fixed set of
runs, for checking that a change to the simulator's structure leaves its results
byte for byte the same.

    rltune bench sim_identity --out DIR [--against REF_DIR] [--limit N] [--only NAME,...]

Each run is one `rltune simulate` process on a Philly slice that queues (the first
`--limit` jobs of the Sep-Oct trace on clusters/philly-hetero-small.yaml, so the MILP
and the types matter): the policies fifo, sjf-est and rl with greedy and MILP
placement; team queues with reclaim (clusters/philly-tenants.yaml at 3x the load);
LAS with preemption; offloading jobs with the MILP's re-placement; and periodic
rounds. Writes `DIR/<run>.csv` (the `--jobs-out` file) and `DIR/sha256.txt`. With
`--against`, compares every CSV with the one of the same name there and exits 1
on the first that differs (naming it and its first differing line).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "philly" / "philly-sep-oct.csv"
SMALL = str(ROOT / "clusters" / "philly-hetero-small.yaml")
TENANTS = str(ROOT / "clusters" / "philly-tenants.yaml")

# name -> the run's own flags (the trace, format and --limit are common)
RUNS: dict[str, list[str]] = {
    **{
        f"{pol}-{pl}": ["--cluster", SMALL, "--policy", pol, "--placer", pl]
        for pol in ("fifo", "sjf-est", "rl")
        for pl in ("greedy", "milp")
    },
    "tenants-reclaim-fifo-greedy": [
        "--cluster", TENANTS, "--policy", "fifo", "--placer", "greedy", "--load", "3",
    ],
    "las-preempt-greedy": [
        "--cluster", SMALL, "--policy", "las", "--placer", "greedy", "--preempt",
    ],
    "offload-replace-fifo": [
        "--cluster", SMALL, "--policy", "fifo", "--placer", "milp+offload+replace",
        "--offload-fraction", "0.3",
    ],
    "interval-sjf-est-greedy": [
        "--cluster", SMALL, "--policy", "sjf-est", "--placer", "greedy", "--round-interval", "60",
    ],
}  # fmt: skip


def main(argv: list[str]) -> int:
    doc = (__doc__ or "").splitlines()[0]
    p = argparse.ArgumentParser(prog="rltune bench sim_identity", description=doc)
    p.add_argument("--out", required=True, help="folder for the CSVs")
    p.add_argument("--against", default=None, help="folder of reference CSVs to compare with")
    p.add_argument("--limit", type=int, default=3000, help="jobs of the trace (default 3000)")
    p.add_argument("--only", default=None, help="comma-separated run names (default: all)")
    args = p.parse_args(argv)
    names = list(RUNS) if args.only is None else args.only.split(",")
    bad = [n for n in names if n not in RUNS]
    if bad:
        p.error(f"unknown run {bad[0]!r}; choose from {', '.join(RUNS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sums = []
    for name in names:
        csv = out / f"{name}.csv"
        cmd = [
            sys.executable, "-m", "rltune", "simulate", "--trace", str(TRACE),
            "--format", "philly", "--limit", str(args.limit), "--jobs-out", str(csv), *RUNS[name],
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            print(f"{name}: rltune simulate exited {done.returncode}", file=sys.stderr)
            print(done.stderr, file=sys.stderr)
            return 1
        digest = hashlib.sha256(csv.read_bytes()).hexdigest()
        sums.append(f"{digest}  {name}.csv")
        print(f"{name}: {digest[:16]} ({sum(1 for _ in csv.open()) - 1} rows)", flush=True)
    (out / "sha256.txt").write_text("\n".join(sums) + "\n")
    if args.against is None:
        return 0
    for name in names:
        mine = (out / f"{name}.csv").read_bytes()
        ref = (Path(args.against) / f"{name}.csv").read_bytes()
        if mine != ref:
            a, b = mine.splitlines(), ref.splitlines()
            pairs = enumerate(zip(a, b, strict=False))
            line = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
            print(f"DIFFERS: {name}.csv, first at line {line + 1}", file=sys.stderr)
            return 1
    print(f"identical: {len(names)} CSVs byte for byte the same as {args.against}")
    return 0
