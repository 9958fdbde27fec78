"""Soak of the lockstep pipeline through SIGKILLs: the per-job CSV must be `rltune
simulate`'s however often its services die.

    .venv/bin/python -m tests.integration.lockstep_soak --jobs 5000 --kill-every 30 [--json OUT]

Loopback only: the embedded broker, and arrival, scoring, placement, telemetry and
cluster-sim as `rltune service NAME` child processes running a Philly slice in
lockstep with a history-reading policy (`sjf-est`) on a cluster small enough for
jobs to queue. Every `--kill-every` seconds one service, picked at random (seeded),
is SIGKILLed and started again, as a supervisor would. When cluster-sim has written
its per-job CSV, that file must equal `rltune simulate`'s for the same slice, and
the shared checker (../shared/tools/check_jobs.py) must pass on it.

Bounded: the run stops at `--deadline-s` and says how far it got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from shared.broker import EmbeddedBroker, ensure_topics
from shared.config import BusSettings
from tests.integration.processes import stop_all
from tests.integration.streaming import small_cluster
from tests.paths import PHILLY, TOOLS

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("arrival", "scoring", "placement", "telemetry", "cluster-sim")


@dataclass
class SoakResult:
    jobs: int
    kills: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    same_as_simulate: bool = False
    checker_ok: bool = False
    rows_differing: int = 0


def _flags(trace_cluster: Path, jobs: int, policy: str, out: Path) -> dict[str, list[str]]:
    common = ["--cluster", str(trace_cluster)]
    return {
        "arrival": [],
        "scoring": ["--policy", policy, *common],
        "placement": ["--placer", "greedy", *common],
        "telemetry": [],
        "cluster-sim": [
            "--trace", str(PHILLY), "--format", "philly", *common, "--policy", policy,
            "--placer", "greedy", "--limit", str(jobs), "--lockstep", "--replay",
            "--resend", "1", "--jobs-out", str(out / "up.csv"), "--json", str(out / "up.json"),
            "--exit-when-done",
        ],
    }  # fmt: skip


def _spawn(bus: BusSettings, name: str, flags: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "rltune", "service", name]
    argv += ["--bootstrap", bus.bootstrap, "--topic-prefix", bus.topic_prefix, *flags]
    with open(log, "ab") as f:
        return subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)


async def soak(
    bus: BusSettings,
    out: Path,
    jobs: int,
    kill_every_s: float,
    seed: int = 0,
    policy: str = "sjf-est",
    deadline_s: float = 3600.0,
    max_kills: int | None = None,
) -> SoakResult:
    """Run the pipeline to its end through the kills (at most `max_kills`, when given);
    compare with `simulate`."""
    rng = random.Random(seed)
    cluster = small_cluster(out)
    flags = _flags(cluster, jobs, policy, out)
    logs = {n: out / f"{n}.log" for n in SERVICES}
    procs = {n: _spawn(bus, n, flags[n], logs[n]) for n in SERVICES}
    result = SoakResult(jobs, kills={n: 0 for n in SERVICES})
    t0 = time.monotonic()
    next_kill = t0 + kill_every_s
    try:
        while procs["cluster-sim"].poll() is None or procs["cluster-sim"].returncode != 0:
            if time.monotonic() - t0 > deadline_s:
                raise TimeoutError(f"not done in {deadline_s:.0f} s; kills so far {result.kills}")
            sim = procs["cluster-sim"]
            if sim.poll() is not None and sim.returncode != 0:  # killed: start it again
                procs["cluster-sim"] = _spawn(
                    bus, "cluster-sim", flags["cluster-sim"], logs["cluster-sim"]
                )
            killed = sum(result.kills.values())
            if time.monotonic() >= next_kill and (max_kills is None or killed < max_kills):
                victim = rng.choice(SERVICES)
                p = procs[victim]
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
                    result.kills[victim] += 1
                    procs[victim] = _spawn(bus, victim, flags[victim], logs[victim])
                next_kill = time.monotonic() + kill_every_s
            await asyncio.sleep(0.5)
    finally:
        stop_all(procs.values())
    result.wall_s = time.monotonic() - t0
    expected = out / "sim.csv"
    argv = [sys.executable, "-m", "rltune", "simulate", "--trace", str(PHILLY), "--format"]
    argv += ["philly", "--cluster", str(cluster), "--policy", policy, "--placer", "greedy"]
    argv += ["--limit", str(jobs), "--jobs-out", str(expected)]
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    got, want = (out / "up.csv").read_text().splitlines(), expected.read_text().splitlines()
    result.same_as_simulate = got == want
    result.rows_differing = sum(a != b for a, b in zip(got, want, strict=False)) + abs(
        len(got) - len(want)
    )
    check = subprocess.run(
        [sys.executable, str(TOOLS / "check_jobs.py"), str(out / "up.csv"), str(out / "up.json")],
        capture_output=True,
    )
    result.checker_ok = check.returncode == 0
    return result


def main() -> None:  # pragma: no cover - the long run, by hand
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--kill-every", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/rltune-lockstep-soak"))
    ap.add_argument("--deadline-s", type=float, default=3600.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker(log_path=a.out / "tansu.log") as b:
        bus = BusSettings(bootstrap=b.bootstrap, topic_prefix="soak.")
        asyncio.run(ensure_topics(bus))
        r = asyncio.run(soak(bus, a.out, a.jobs, a.kill_every, a.seed, deadline_s=a.deadline_s))
    text = json.dumps(asdict(r), indent=1)
    print(text)
    if a.json:
        a.json.write_text(text)
    sys.exit(0 if r.same_as_simulate and r.checker_ok else 1)


if __name__ == "__main__":
    main()
