"""Telemetry on the real broker: the offload terms of running jobs reach `Reward.parts`,
and the snapshot's figures are `shared.metrics.summarize` of the same jobs."""

from __future__ import annotations

import asyncio
import statistics

import msgspec

from services.telemetry import service as telemetry
from shared.bus import Producer, Record, read_back
from shared.config import BusSettings
from shared.messages import (
    Job,
    JobEvent,
    MetricsSnapshot,
    NodeStatus,
    OffloadStats,
    Rejection,
    Reward,
    encode,
)
from tests.integration.streaming import services

FORGED_STATS = {"job_id": "run-b", "node_id": "n0", "hit_rate": 0.5}
STATS = {  # job -> (hit rate, migration p50, migration p99)
    "run-a": (0.9, 1.5, 4.0),
    "run-b": (0.6, 2.5, 9.0),
}


async def test_offload_stats_of_running_jobs_reach_the_reward(bus: BusSettings) -> None:
    t = bus.topics
    msgs: list[tuple[str, str, bytes]] = [
        (t.cluster_nodes, "n0", encode(NodeStatus("n0", "V100", 4, [2, 3], time=100.0))),
        (t.jobs_accepted, "done", encode(Job("done", 1, 0.0))),
        (t.jobs_events, "done", encode(JobEvent("done", "started", 10.0, ["n0"], "n0:0"))),
        (t.jobs_events, "done", encode(JobEvent("done", "finished", 40.0, ["n0"]))),
    ]
    for i, (jid, (hit, p50, p99)) in enumerate(STATS.items()):
        msgs.append((t.jobs_accepted, jid, encode(Job(jid, 1, 50.0))))
        msgs.append((t.jobs_events, jid, encode(JobEvent(jid, "started", 60.0, ["n0"], f"n0:{i}"))))
        st = OffloadStats(jid, "n0", hit, migration_ms_p50=p50, migration_ms_p99=p99, time=70.0)
        msgs.append((t.offload_stats, jid, encode(st)))
    # forged but well-formed JSON: refused on decode, each with its field, none counted
    forged = [
        (t.offload_stats, "run-a", {"job_id": "run-a", "node_id": "n0", "hit_rate": 7.5}),
        (t.offload_stats, "run-b", {**FORGED_STATS, "migration_ms_p99": 1e308}),
        (t.cluster_nodes, "n0", {"node_id": "n0", "gpu_type": "V100", "gpus": -8, "free_gpus": []}),
        (t.cluster_nodes, "n0", {"node_id": "n0", "gpu_type": "V100", "gpus": 4, "free_gpus": [9]}),
    ]
    msgs += [(topic, key, msgspec.json.encode(body)) for topic, key, body in forged]
    async with Producer(bus) as p:
        for topic, key, value in msgs:
            await (await p.send(topic, key, value))
    conf = telemetry.TelemetrySettings(interval_s=0.3, window_s=1000.0)
    async with services(bus, {"telemetry": lambda stop: telemetry.serve(bus, stop, conf=conf)}):
        rewards: list[Record] = []
        for _ in range(100):
            await asyncio.sleep(0.3)
            rewards.clear()
            await read_back(bus, [t.rl_rewards], rewards.append)
            if rewards and b"offload_hit_rate" in (rewards[-1].value or b""):
                break
    reward = msgspec.json.decode(rewards[-1].value or b"", type=Reward)
    hits = [h for h, _, _ in STATS.values()]
    assert reward.parts["offload_hit_rate"] == statistics.mean(hits)
    assert reward.parts["offload_migration_ms_p99"] == 9.0
    assert reward.parts["offload_jobs"] == 2
    assert reward.parts["avg_bsld"] == 40 / 30  # (finish - submit) / max(run, 10 s)
    assert reward.value == -40 / 30 + statistics.mean(hits) - 9.0 / 1e3
    snaps: list[Record] = []
    await read_back(bus, [t.metrics], snaps.append)
    last = [
        s
        for s in (msgspec.json.decode(r.value or b"", type=MetricsSnapshot) for r in snaps)
        if s.source == "telemetry.all"
    ][-1]
    assert last.jobs == 1 and last.avg_jct_s == 40.0 and last.avg_queue_s == 10.0
    assert last.counters["running"] == 2 and last.counters["util_V100"] == 0.5
    dead: list[Record] = []
    await read_back(
        bus, [t.dead_letter(t.offload_stats), t.dead_letter(t.cluster_nodes)], dead.append
    )
    reasons = sorted(msgspec.json.decode(r.value or b"", type=Rejection).reason for r in dead)
    assert len(reasons) == 4
    for field in ("$.hit_rate", "$.migration_ms_p99", "$.gpus", "$.free_gpus"):
        assert sum(field in r for r in reasons) == 1, (field, reasons)


async def test_nothing_is_published_before_the_state_is_rebuilt(bus: BusSettings) -> None:
    """A (re)started telemetry first reads the topics back; until then its windows
    are empty, and a snapshot of zeros or a reward over no jobs would be taken for
    the run's (scoring --learn trains on rewards). Every snapshot it publishes
    counts the 30 jobs already finished, and every reward is over them."""
    t = bus.topics
    async with Producer(bus) as p:
        for i in range(30):
            jid = f"done-{i}"
            for topic, msg in [
                (t.jobs_accepted, Job(jid, 1, float(i))),
                (t.jobs_events, JobEvent(jid, "started", i + 5.0, ["n0"], "n0:0")),
                (t.jobs_events, JobEvent(jid, "finished", i + 65.0, ["n0"])),
            ]:
                await p.send(topic, jid, encode(msg))
        await p.flush()
    conf = telemetry.TelemetrySettings(interval_s=0.05, window_s=1e9)
    snaps: list[Record] = []
    async with services(bus, {"telemetry": lambda stop: telemetry.serve(bus, stop, conf=conf)}):
        for _ in range(150):  # until it has published a few rewards
            await asyncio.sleep(0.2)
            snaps.clear()
            await read_back(bus, [t.metrics, t.rl_rewards], snaps.append)
            if sum(r.topic == t.rl_rewards for r in snaps) >= 5:
                break
    decoded = [
        msgspec.json.decode(r.value or b"", type=MetricsSnapshot)
        for r in snaps
        if r.topic == t.metrics
    ]
    mine = [s for s in decoded if s.source.startswith("telemetry.")]  # not its service health
    assert mine and all(s.jobs == 30 for s in mine), sorted({s.jobs for s in mine})
    rewards = [
        msgspec.json.decode(r.value or b"", type=Reward) for r in snaps if r.topic == t.rl_rewards
    ]
    assert rewards and all(r.parts["jobs"] == 30 for r in rewards)
    assert all(r.parts["avg_bsld"] == 65 / 60 for r in rewards)  # each: (finish - submit) / run
