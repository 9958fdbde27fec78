"""Lockstep over the real broker gives `rltune simulate`'s per-job start times, with
or without garbage on every internal topic (dead-lettered once, by its owner)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pytest

from services.telemetry import service as telemetry
from shared.bus import Producer, Record, read_back
from shared.cli import main
from shared.config import BusSettings
from shared.messages import MetricsSnapshot
from tests.integration.streaming import lockstep_runs, publish_trace, services, small_cluster
from tests.paths import PHILLY

INTERNAL = (
    "sched.priorities", "sched.placements", "sched.rounds", "cluster.nodes", "jobs.events",
    "offload.stats", "rl.rewards",
)  # fmt: skip


def garbage(seed: int) -> list[bytes]:
    """Bytes no consumer can take: random bytes, broken and wrong-shaped JSON."""
    rng = random.Random(seed)
    return [
        rng.randbytes(rng.randint(1, 64)),
        b"",
        b'{"round_id": "seven", "time": [], "jobs": 3}',
        b"[1, 2",
        '{"job_id": "\u00e9\u00e9", "kind": "exploded"}'.encode(),
    ]


async def _publish_garbage(bus: BusSettings) -> int:
    async with Producer(bus) as p:
        for i, suffix in enumerate(INTERNAL):
            for value in garbage(i):
                await p.send(bus.topics.name(suffix), "junk", value)
        await p.flush()
    return len(garbage(0))


LIMIT = 60


def _simulate(tmp: Path, cluster: Path, policy: str, placer: str) -> Path:
    out = tmp / "sim.csv"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster)]
    argv += ["--policy", policy, "--placer", placer, "--limit", str(LIMIT), "--jobs-out", str(out)]
    assert main(argv) == 0
    return out


@pytest.mark.parametrize(("policy", "bad_input"), [("rl", False), ("sjf-est", True)])
async def test_lockstep_same_start_times_as_simulate(
    bus: BusSettings, tmp_path: Path, policy: str, bad_input: bool
) -> None:
    cluster = small_cluster(tmp_path)
    per_topic = await _publish_garbage(bus) if bad_input else 0
    await publish_trace(bus, cluster, LIMIT)
    runs = lockstep_runs(bus, cluster, policy, "milp", LIMIT, tmp_path)
    conf = telemetry.TelemetrySettings(interval_s=0.5)
    runs["telemetry"] = lambda stop: telemetry.serve(bus, stop, conf=conf)
    async with services(bus, runs) as tasks:
        await asyncio.wait_for(tasks["cluster-sim"], 240)
        await asyncio.sleep(1.5)  # a telemetry snapshot after the end
    if bad_input:  # each bad message dead-lettered exactly once, and counted
        for suffix in INTERNAL:
            dlq: list[Record] = []
            await read_back(bus, [bus.topics.name(suffix) + ".dlq"], dlq.append)
            assert len(dlq) == per_topic, suffix
        snaps: list[Record] = []
        await read_back(bus, [bus.topics.metrics], snaps.append)
        last = [
            s
            for s in (msgspec.json.decode(r.value or b"", type=MetricsSnapshot) for r in snaps)
            if s.source == "telemetry.all"
        ][-1]
        assert last.rejected == {bus.topics.name(s) + ".dlq": per_topic for s in INTERNAL}
    expected = _simulate(tmp_path, cluster, policy, "milp").read_text()
    got = (tmp_path / "up.csv").read_text()
    starts = [line.split(",")[:5] for line in expected.splitlines()]
    assert len(starts) == LIMIT + 1
    assert sum(1 for s in starts[1:] if s[3] and float(s[3]) > float(s[2])) > 5  # jobs queued
    assert got == expected
