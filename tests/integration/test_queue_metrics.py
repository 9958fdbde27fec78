"""Per-queue figures on the real broker: telemetry reads a hand-made run, and what
/metrics serves (and the metrics stream carries) equals the state worked out here
by hand: pending jobs, GPUs held per type, GPUs borrowed, preemptions by reason, and
the fair-share factor from Slurm's formula over usage integrated in a few lines."""

from __future__ import annotations

import asyncio
import math
import urllib.request
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.telemetry import service as telemetry
from shared.broker import free_port
from shared.bus import Producer, Record, read_back
from shared.config import BusSettings
from shared.messages import Job, JobEvent, MetricsSnapshot, NodeStatus, encode
from shared.prom import serve_http
from tests.integration.streaming import services
from tests.shared.test_fairshare import slurm_classic

H = 3600.0
CLUSTER = """
nodes:
  - {name: qv, count: 2, gpu_type: V100, gpus: 8}
  - {name: qp, count: 1, gpu_type: P100, gpus: 4}
queues:
  qorg: {guaranteed_gpus: 8, limit_gpus: 16}
  qteama: {parent: qorg, guaranteed_gpus: 4}
  qteamb: {parent: qorg, guaranteed_gpus: 4}
fair_share: {half_life_h: 1}
"""


def used(g: float, start: float, end: float, t: float) -> float:
    """g GPUs over [start, end], decayed to t with half-life H."""
    k = math.log(2) / H
    return g / k * (math.exp(-k * (t - end)) - math.exp(-k * (t - start)))


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


async def test_queue_metrics_equal_the_state(bus: BusSettings, tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(CLUSTER)
    t = bus.topics
    nodes = [
        NodeStatus("qv-0", "V100", 8, [4, 5, 6, 7], time=1000.0),
        NodeStatus("qv-1", "V100", 8, list(range(8)), time=1000.0),
        NodeStatus("qp-0", "P100", 4, [2, 3], time=1000.0),
    ]
    msgs: list[tuple[str, str, bytes]] = [(t.cluster_nodes, n.node_id, encode(n)) for n in nodes]
    jobs = [
        Job("a1", 4, 0.0, vc="qteama"),  # runs on V100 from 0
        Job("a2", 2, 0.0, vc="qteama"),  # runs on P100 from 0
        Job("b1", 2, 0.0, vc="qteamb"),  # runs [100, 200], preempted: pending again
        Job("b2", 1, 50.0, vc="qteamb"),  # never starts: pending
        Job("z1", 1, 0.0, vc="qzz"),  # no queue of its own: default; runs [0, 1000]
        Job("later", 1, 5000.0, vc="qteamb"),  # submitted after the clock: not pending
    ]
    msgs += [(t.jobs_accepted, j.job_id, encode(j)) for j in jobs]
    events = [
        JobEvent("a1", "started", 0.0, ["qv-0"], "qv-0:0+1+2+3"),
        JobEvent("a2", "started", 0.0, ["qp-0"], "qp-0:0+1"),
        JobEvent("z1", "started", 0.0, ["qv-1"], "qv-1:0"),
        JobEvent("b1", "started", 100.0, ["qv-1"], "qv-1:1+2"),
        JobEvent("b1", "preempted", 200.0, ["qv-1"], "reclaim: for qteama"),
        JobEvent("z1", "finished", 1000.0, ["qv-1"]),
    ]
    msgs += [(t.jobs_events, e.job_id, encode(e)) for e in events]
    async with Producer(bus) as p:
        for topic, key, value in msgs:
            await (await p.send(topic, key, value))

    port = free_port()
    httpd = serve_http(port)
    conf = telemetry.TelemetrySettings(interval_s=0.3, window_s=1000.0, cluster=str(cluster))
    try:
        async with services(bus, {"telemetry": lambda stop: telemetry.serve(bus, stop, conf=conf)}):
            for _ in range(100):
                await asyncio.sleep(0.3)
                got = scrape(port)
                if (
                    got.get(
                        ("rltune_queue_allocated_gpus", (("gpu_type", "all"), ("queue", "default")))
                    )
                    == 0.0
                ):
                    break
            await asyncio.sleep(0.6)  # one more export after the last event
            got = scrape(port)
    finally:
        assert httpd is not None
        httpd.shutdown()

    def val(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    # by hand: qteama holds 4 V100 + 2 P100 (guarantee 4: borrows 2); its org holds the
    # same 6 (guarantee 8: borrows none); qteamb waits with b1 (preempted) and b2
    assert val("rltune_queue_pending_jobs", queue="qteamb") == 2
    assert val("rltune_queue_pending_jobs", queue="qteama") == 0
    assert val("rltune_queue_allocated_gpus", queue="qteama", gpu_type="all") == 6
    assert val("rltune_queue_allocated_gpus", queue="qteama", gpu_type="V100") == 4
    assert val("rltune_queue_allocated_gpus", queue="qteama", gpu_type="P100") == 2
    assert val("rltune_queue_allocated_gpus", queue="qorg", gpu_type="all") == 6
    assert val("rltune_queue_allocated_gpus", queue="qteamb", gpu_type="all") == 0
    assert val("rltune_queue_borrowed_gpus", queue="qteama") == 2
    assert val("rltune_queue_borrowed_gpus", queue="qorg") == 0
    assert val("rltune_queue_borrowed_gpus", queue="qteamb") == 0
    assert val("rltune_preemptions_total", queue="qteamb", reason="reclaim") == 1
    # fair share at the clock (1000 s): usage integrated here, Slurm's formula
    now = 1000.0
    raw = {
        "qteama": used(6, 0, now, now),
        "qteamb": used(2, 100, 200, now),
        "default": used(1, 0, 1000, now),
    }
    raw["qorg"] = raw["qteama"] + raw["qteamb"]
    parent = {"qteama": "qorg", "qteamb": "qorg", "qorg": None, "default": None}
    want = slurm_classic(raw, dict.fromkeys(raw, 1.0), parent)
    for q, f in want.items():
        assert val("rltune_queue_fair_share_factor", queue=q) == pytest.approx(f, rel=1e-9)

    # the same figures in the metrics stream
    snaps: list[Record] = []
    await read_back(bus, [t.metrics], snaps.append)
    last = [
        s
        for s in (msgspec.json.decode(r.value or b"", type=MetricsSnapshot) for r in snaps)
        if s.source == "telemetry.all"
    ][-1]
    queues = last.queues
    assert queues["qteamb"]["pending_jobs"] == 2 and queues["qteamb"]["preemptions.reclaim"] == 1
    assert queues["qteama"]["allocated_gpus.V100"] == 4 and queues["qteama"]["borrowed_gpus"] == 2
    assert queues["qorg"]["fair_share"] == pytest.approx(want["qorg"], rel=1e-9)
