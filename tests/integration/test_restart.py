"""Restart survival on the real broker: SIGKILL the scoring service, then the
placement service, in the middle of a run, and restart each. They rebuild their
state from the topics, cluster_sim asks the unanswered round again, and the run
ends with exactly `rltune simulate`'s per-job CSV, which the independent checker
(../shared/tools/check_jobs.py) passes: every job finished once, no GPU given twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from services.arrival import service as arrival
from services.cluster_sim import service as cluster_sim
from shared.bus import Record, read_back
from shared.cli import main
from shared.config import BusSettings
from tests.integration.streaming import publish_trace, services, small_cluster
from tests.paths import PHILLY, TOOLS

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 40


def _spawn(bus: BusSettings, name: str, flags: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "shared.cli", "service", name]
    argv += ["--bootstrap", bus.bootstrap, "--topic-prefix", bus.topic_prefix, *flags]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


async def _placements(bus: BusSettings) -> int:
    recs: list[Record] = []
    await read_back(bus, [bus.topics.sched_placements], recs.append)
    return len(recs)


async def _kill_after(bus: BusSettings, proc: subprocess.Popen[bytes], rounds: int) -> None:
    while await _placements(bus) < rounds:
        await asyncio.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


async def test_scoring_and_placement_killed_mid_run(bus: BusSettings, tmp_path: Path) -> None:
    cluster = small_cluster(tmp_path)
    await publish_trace(bus, cluster, LIMIT)
    flags = {
        "scoring": ["--policy", "fifo", "--cluster", str(cluster), "--rounds", "driven"],
        "placement": ["--placer", "milp", "--cluster", str(cluster), "--reproducible"],
    }
    logs = {name: tmp_path / f"{name}.log" for name in flags}
    procs = {name: _spawn(bus, name, f, logs[name]) for name, f in flags.items()}
    sim_conf = cluster_sim.SimSettings(
        trace=str(PHILLY), format="philly", cluster=str(cluster), policy="fifo", placer="milp",
        limit=LIMIT, lockstep=True, resend_s=1.0, json_out=str(tmp_path / "up.json"),
        jobs_out=str(tmp_path / "up.csv"), exit_when_done=True,
    )  # fmt: skip
    runs = {
        "arrival": lambda stop: arrival.serve(bus, stop),
        "cluster-sim": lambda stop: cluster_sim.serve(bus, stop, conf=sim_conf),
    }
    try:
        async with services(bus, runs) as tasks:
            # scoring dies mid-run; while it comes back, placement dies too
            for name, after in (("scoring", 8), ("placement", 8)):
                await _kill_after(bus, procs[name], after)
                procs[name] = _spawn(bus, name, flags[name], logs[name])
            await asyncio.wait_for(tasks["cluster-sim"], 240)
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(30)
    expected = tmp_path / "sim.csv"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster)]
    argv += ["--policy", "fifo", "--placer", "milp", "--limit", str(LIMIT)]
    assert main([*argv, "--jobs-out", str(expected)]) == 0
    got = (tmp_path / "up.csv").read_text()
    assert got == expected.read_text()
    assert got.count("\n") == LIMIT + 1  # one segment per job: none ran twice
    done = subprocess.run(
        [sys.executable, str(TOOLS / "check_jobs.py"), str(tmp_path / "up.csv"),
         str(tmp_path / "up.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "read back" in logs["scoring"].read_text().split("read back", 1)[1]  # restarted
