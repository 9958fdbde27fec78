"""Lockstep over the real broker gives `rltune simulate`'s per-job start times."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shared.cli import main
from shared.config import BusSettings
from tests.integration.streaming import lockstep_runs, publish_trace, services, small_cluster
from tests.paths import PHILLY

LIMIT = 60


def _simulate(tmp: Path, cluster: Path, policy: str, placer: str) -> Path:
    out = tmp / "sim.csv"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster)]
    argv += ["--policy", policy, "--placer", placer, "--limit", str(LIMIT), "--jobs-out", str(out)]
    assert main(argv) == 0
    return out


@pytest.mark.parametrize("policy", ["fifo", "sjf-est"])
async def test_lockstep_same_start_times_as_simulate(
    bus: BusSettings, tmp_path: Path, policy: str
) -> None:
    cluster = small_cluster(tmp_path)
    await publish_trace(bus, cluster, LIMIT)
    runs = lockstep_runs(bus, cluster, policy, "milp", LIMIT, tmp_path)
    async with services(bus, runs) as tasks:
        await asyncio.wait_for(tasks["cluster-sim"], 240)
    expected = _simulate(tmp_path, cluster, policy, "milp").read_text()
    got = (tmp_path / "up.csv").read_text()
    starts = [line.split(",")[:5] for line in expected.splitlines()]
    assert len(starts) == LIMIT + 1
    assert sum(1 for s in starts[1:] if s[3] and float(s[3]) > float(s[2])) > 5  # jobs queued
    assert got == expected
