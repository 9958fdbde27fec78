"""Restart survival on the real broker, in real time: during a replay paced against
the wall clock (`--speedup`, not lockstep) SIGKILL the scoring service, then the
placement service, then cluster_sim, and restart each. Scoring and placement rebuild
their state from the topics; cluster_sim runs the trace again up to the last
answered round from the answers on the topics (running jobs, free GPUs, virtual
clock) and asks the unanswered one again. Every job finishes exactly once, no GPU
is given twice (the independent checker, ../shared/tools/check_jobs.py, on the
per-job output), the metrics stream goes on after the last kill, and with the
placer on deterministic time the per-job CSV is exactly `rltune simulate`'s."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from rltune import main
from services.arrival import service as arrival
from services.telemetry import service as telemetry
from shared.bus import Record, read_back
from shared.config import BusSettings
from shared.messages import MetricsSnapshot
from tests.integration import lockstep_soak
from tests.integration.streaming import services, small_cluster
from tests.paths import PHILLY, TOOLS

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 40
SPEEDUP = 1e6  # the slice's 189 simulated days in about 16 s of wall time


def _spawn(bus: BusSettings, name: str, flags: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "rltune", "service", name]
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


async def test_scoring_placement_cluster_sim_killed_in_real_time(
    bus: BusSettings, tmp_path: Path
) -> None:
    cluster = small_cluster(tmp_path)
    up_csv, up_json = tmp_path / "up.csv", tmp_path / "up.json"
    flags = {
        "scoring": ["--policy", "fifo", "--cluster", str(cluster)],
        "placement": ["--placer", "milp", "--cluster", str(cluster), "--reproducible"],
        "cluster-sim": [
            "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster),
            "--policy", "fifo", "--placer", "milp", "--limit", str(LIMIT),
            "--speedup", str(SPEEDUP), "--replay", "--resend", "1",
            "--jobs-out", str(up_csv), "--json", str(up_json), "--exit-when-done",
        ],
    }  # fmt: skip
    logs = {name: tmp_path / f"{name}.log" for name in flags}
    procs = {name: _spawn(bus, name, f, logs[name]) for name, f in flags.items()}
    conf = telemetry.TelemetrySettings(interval_s=0.5)
    runs = {
        "arrival": lambda stop: arrival.serve(bus, stop),
        "telemetry": lambda stop: telemetry.serve(bus, stop, conf=conf),
    }
    try:
        async with services(bus, runs):
            # placement dies while scoring comes back; cluster-sim dies later
            for name, after in (("scoring", 6), ("placement", 6), ("cluster-sim", 14)):
                await _kill_after(bus, procs[name], after)
                procs[name] = _spawn(bus, name, flags[name], logs[name])
            killed_at = time.time()
            assert procs["cluster-sim"].wait(240) == 0
            await asyncio.sleep(1.5)  # a telemetry snapshot after the end
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(30)
    sim_log = logs["cluster-sim"].read_text()
    assert "restart:" in sim_log  # the second cluster-sim read the first one's rounds back
    asked = int(sim_log.split("done: ", 1)[1].split(" rounds asked")[0])
    assert asked > 0  # ... and went on from there: it was killed mid-run
    assert "read back" in logs["scoring"].read_text().split("read back", 1)[1]  # restarted
    # every job once, no GPU twice: the independent checker on the per-job output
    done = subprocess.run(
        [sys.executable, str(TOOLS / "check_jobs.py"), str(up_csv), str(up_json)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    got = up_csv.read_text()
    assert got.count("\n") == LIMIT + 1  # one segment per job: none ran twice
    expected = tmp_path / "sim.csv"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster)]
    argv += ["--policy", "fifo", "--placer", "milp", "--limit", str(LIMIT)]
    assert main([*argv, "--jobs-out", str(expected)]) == 0
    assert got == expected.read_text()
    # the metrics stream went on after the last kill, up to every job done
    snaps: list[Record] = []
    await read_back(bus, [bus.topics.metrics], snaps.append)
    later = [r for r in snaps if r.timestamp_ms / 1e3 > killed_at]
    decoded = [msgspec.json.decode(r.value or b"", type=MetricsSnapshot) for r in later]
    tail = [snap for snap in decoded if snap.source == "telemetry.all"]
    assert len(tail) >= 2
    assert tail[-1].jobs == LIMIT


async def test_history_reading_policy_through_kills_in_lockstep(
    bus: BusSettings, tmp_path: Path
) -> None:
    """A slice that queues, `sjf-est` (it ranks by the run-time history): scoring is
    SIGKILLed twice, placement and cluster-sim once, at different rounds, each
    restarted; the per-job CSV is exactly `rltune simulate`'s. (Scoring's rebuild
    used to skip every job the events had already marked finished, so its history
    came back empty and later rounds ranked differently.)"""
    limit = 100
    cluster = small_cluster(tmp_path)
    up_csv, up_json = tmp_path / "up.csv", tmp_path / "up.json"
    common = ["--cluster", str(cluster)]
    flags = {
        "scoring": ["--policy", "sjf-est", *common],
        "placement": ["--placer", "greedy", *common],
        "cluster-sim": [
            "--trace", str(PHILLY), "--format", "philly", *common, "--policy", "sjf-est",
            "--placer", "greedy", "--limit", str(limit), "--lockstep", "--replay",
            "--resend", "1", "--jobs-out", str(up_csv), "--json", str(up_json),
            "--exit-when-done",
        ],
    }  # fmt: skip
    logs = {name: tmp_path / f"{name}.log" for name in flags}
    procs = {name: _spawn(bus, name, f, logs[name]) for name, f in flags.items()}
    runs = {"arrival": lambda stop: arrival.serve(bus, stop)}
    try:
        async with services(bus, runs):
            kills = [("scoring", 20), ("placement", 45), ("scoring", 70), ("cluster-sim", 95)]
            for name, after in kills:
                await _kill_after(bus, procs[name], after)
                procs[name] = _spawn(bus, name, flags[name], logs[name])
            assert procs["cluster-sim"].wait(300) == 0
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(30)
    assert logs["scoring"].read_text().count("read back") >= 3  # started three times
    expected = tmp_path / "sim.csv"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", *common]
    argv += ["--policy", "sjf-est", "--placer", "greedy", "--limit", str(limit)]
    assert main([*argv, "--jobs-out", str(expected)]) == 0
    got, want = up_csv.read_text().splitlines(), expected.read_text().splitlines()
    assert len(got) == limit + 1
    assert got == want


async def test_lockstep_soak_small(bus: BusSettings, tmp_path: Path) -> None:
    """The soak (tests/integration/lockstep_soak.py) at CI size: 80 jobs, a random
    service SIGKILLed every 4 s, five times (`python -m tests.integration.lockstep_soak`
    runs 5,000 jobs with a kill every 30 s). The pipeline alone takes about 13 s here;
    each kill adds a rebuild and a consumer-group rebalance, so the kills are counted
    rather than timed: a kill every 6 s to the end took 240 s."""
    r = await lockstep_soak.soak(
        bus, tmp_path, jobs=80, kill_every_s=4.0, seed=3, deadline_s=480, max_kills=5
    )
    assert sum(r.kills.values()) >= 3
    assert r.checker_ok and r.same_as_simulate, r
