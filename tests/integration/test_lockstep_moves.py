"""Re-placement over the real broker: with `milp+offload+replace`, cluster-sim asks
placement for moves (`RoundRequest(replace)`), applies each `MoveOrder` with its restart
cost, and the run's per-job CSV (segments, `offload_s`, `restart_s`) is byte for byte
the in-process simulator's on the same jobs, with re-placement's queue check off
and on; telemetry sees every move as a new
segment of the running job, with the move's restore."""

from __future__ import annotations

import asyncio
import csv
import functools
from pathlib import Path

import pytest

from rltune import main
from services.cluster_sim import rounds
from services.placement import registry
from services.telemetry import service as telemetry
from services.telemetry.windows import Telemetry
from shared.bus import Producer, Record, read_back
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.messages import encode
from shared.replay import job_spec_of
from shared.sched.replacement import ReplaceConfig
from shared.sim import load_jobs
from shared.sim.offload_jobs import mark_offloading
from shared.traces import SkipStats
from tests.integration.streaming import lockstep_runs, services
from tests.paths import PHILLY

# 16 V100 and 8 P100 GPUs in 4-GPU servers whose links offloading jobs share: on the
# first 60 Philly jobs with 80% of them offloading (marking seed 0) the in-process
# simulator moves five running offloading jobs
CLUSTER = """\
name: moves
reference: V100
nodes:
  - {name: a, count: 4, gpu_type: V100, gpus: 4, pcie_gbps: 16, nvme_gbps: 3}
  - {name: p, count: 2, gpu_type: P100, gpus: 4, pcie_gbps: 16, nvme_gbps: 3}
"""
LIMIT, FRACTION, PLACER = 60, 0.8, "milp+offload+replace"


async def _publish_marked(bus: BusSettings, cluster: Path) -> None:
    """The slice on `jobs.submit`, each offloading job declaring its parameter bytes
    (`JobSpec.offload`) as a submitter of such a job would."""
    jobs = load_jobs(PHILLY, "philly", load_cluster(cluster), SkipStats(), LIMIT)
    async with Producer(bus) as p:
        for j in mark_offloading(jobs, FRACTION, 0):
            spec = job_spec_of(j)
            spec.submit_time = j.submit_s
            await p.send(bus.topics.jobs_submit, spec.job_id, encode(spec))
        await p.flush()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("check", ["off", "pareto"])
async def test_moves_over_the_bus_are_the_simulators(
    bus: BusSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    """(With the queue check: the waiting jobs and expected ends go out in the replace
    request, and placement's check decides as the simulator's does.)"""
    config = functools.partial(ReplaceConfig, queue_check=check)
    monkeypatch.setattr(registry, "ReplaceConfig", config)
    monkeypatch.setattr(rounds, "ReplaceConfig", config)
    cluster = tmp_path / "moves.yaml"
    cluster.write_text(CLUSTER)
    expected = tmp_path / "sim.csv"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster)]
    argv += [
        "--policy",
        "fifo",
        "--placer",
        PLACER,
        "--limit",
        str(LIMIT),
        "--offload-fraction",
        str(FRACTION),
    ]
    assert main([*argv, "--jobs-out", str(expected)]) == 0
    rows = list(csv.DictReader(expected.open()))
    moved = {r["job_id"] for r in rows if float(r["restart_s"] or 0) > 0}
    assert len(moved) >= 3  # the slice exercises moves
    if check != "off":  # ... and the check: it refuses moves the unchecked run makes
        monkeypatch.setattr(registry, "ReplaceConfig", ReplaceConfig)
        unchecked = tmp_path / "unchecked.csv"
        assert main([*argv, "--jobs-out", str(unchecked)]) == 0
        assert unchecked.read_text() != expected.read_text()
        monkeypatch.setattr(registry, "ReplaceConfig", config)

    await _publish_marked(bus, cluster)
    runs = lockstep_runs(bus, cluster, "fifo", PLACER, LIMIT, tmp_path, FRACTION)
    conf = telemetry.TelemetrySettings(interval_s=0.5)
    runs["telemetry"] = lambda stop: telemetry.serve(bus, stop, conf=conf)
    async with services(bus, runs) as tasks:
        stats = await asyncio.wait_for(tasks["cluster-sim"], 240)
    assert stats.extra["moves"] == sum(float(r["restart_s"] or 0) > 0 for r in rows)
    assert stats.extra["bad_moves"] == 0
    assert (tmp_path / "up.csv").read_text() == expected.read_text()

    # telemetry, from the topics alone: each move ends a segment and begins one on the
    # new GPUs whose restore is the MoveOrder's restart_s (the events read before the
    # placements here: a consumer of both topics may see either first)
    t = Telemetry()
    recs: list[Record] = []
    topics = [bus.topics.jobs_accepted, bus.topics.cluster_nodes, bus.topics.sched_placements]
    await read_back(bus, [*topics, bus.topics.jobs_events], recs.append)
    handler = telemetry.TelemetryHandler(bus, stats, conf)
    handler.state = t
    order = [bus.topics.jobs_accepted, bus.topics.cluster_nodes, bus.topics.jobs_events]
    for rec in sorted(recs, key=lambda r: order.index(r.topic) if r.topic in order else 3):
        handler.apply(rec, strict=False)
    assert t.counters()["moves"] == stats.extra["moves"]
    got = {r.job_id: r for r in t.records()}
    for row in rows:
        if float(row["restart_s"] or 0) > 0:
            seg = next(s for s in got[row["job_id"]].segments if s.start_s == float(row["start_s"]))
            assert seg.restart_s == pytest.approx(float(row["restart_s"] or 0), abs=1e-6)
            assert seg.finish_s == pytest.approx(float(row["finish_s"]), abs=1e-6)
