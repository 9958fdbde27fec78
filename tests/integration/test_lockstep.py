"""Lockstep over the real broker gives `rltune simulate`'s per-job start times, with
or without garbage on every internal topic (dead-lettered once, by its owner), for
the learned policy (with offloading jobs: their `OffloadStats` from cluster-sim's
cost model reach the reward), sjf-est, and LAS with preemption (jobs stopped and
put back in the queue through the services, their attained service carried)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pytest

from rltune import main
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.telemetry import service as telemetry
from shared.bus import Producer, Record, read_back
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.messages import (
    Assignment,
    MetricsSnapshot,
    OffloadStats,
    PlacementBatch,
    PriorityBatch,
    Rejection,
    Reward,
    encode,
)
from shared.sim import SimConfig, SimResult, load_jobs, simulate
from shared.sim.offload_jobs import mark_offloading
from shared.traces import SkipStats
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


def _simulate(
    tmp: Path,
    cluster: Path,
    policy: str,
    placer: str,
    offload: float,
    preempt: bool,
    interval: float = 0.0,
) -> Path:
    out = tmp / "sim.csv"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster)]
    argv += ["--policy", policy, "--placer", placer, "--limit", str(LIMIT), "--jobs-out", str(out)]
    argv += ["--preempt"] if preempt else []
    argv += ["--round-interval", str(interval)] if interval else []
    assert main([*argv, "--offload-fraction", str(offload)]) == 0
    return out


def _hit_rates(stats: list[OffloadStats], finish: dict[str, float]) -> dict[str, float]:
    """Each job's hit rate over its run, integrated from its rate changes on the topic
    (each holds from its time to the next one, the last to the job's finish)."""
    by_job: dict[str, list[OffloadStats]] = {}
    for s in stats:
        by_job.setdefault(s.job_id, []).append(s)
    out = {}
    for jid, ss in by_job.items():
        ends = [s.time for s in ss[1:]] + [finish[jid]]
        spans = [(end - s.time, s.hit_rate) for s, end in zip(ss, ends, strict=True)]
        out[jid] = sum(dt * h for dt, h in spans) / sum(dt for dt, _ in spans)
    return out


def _in_process(cluster: Path, offload: float) -> SimResult:
    spec = load_cluster(cluster)
    jobs = mark_offloading(load_jobs(PHILLY, "philly", spec, SkipStats(), LIMIT), offload, 0)
    placer = make_placer("milp", reproducible=True)
    return simulate(jobs, spec, make_policy("rl"), placer, SimConfig())


@pytest.mark.parametrize(
    ("policy", "bad_input", "offload", "preempt"),
    [
        ("rl", False, 0.5, False),
        ("sjf-est", True, 0.0, False),
        ("las", False, 0.0, True),
        ("drf", False, 0.0, False),  # its fair-share tie-break: usage from the events
    ],
)
async def test_lockstep_same_start_times_as_simulate(
    bus: BusSettings, tmp_path: Path, policy: str, bad_input: bool, offload: float, preempt: bool
) -> None:
    cluster = small_cluster(tmp_path)
    per_topic = await _publish_garbage(bus) if bad_input else 0
    await publish_trace(bus, cluster, LIMIT)
    runs = lockstep_runs(bus, cluster, policy, "milp", LIMIT, tmp_path, offload, preempt)
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
    if offload:  # the cost model's figures on offload.stats, and in the reward
        recs: list[Record] = []
        await read_back(bus, [bus.topics.offload_stats, bus.topics.rl_rewards], recs.append)
        stats = [
            msgspec.json.decode(r.value or b"", type=OffloadStats)
            for r in recs
            if r.topic == bus.topics.offload_stats
        ]
        rewards = [
            msgspec.json.decode(r.value or b"", type=Reward)
            for r in recs
            if r.topic == bus.topics.rl_rewards
        ]
        assert any("offload_hit_rate" in r.parts for r in rewards)
        result = _in_process(cluster, offload)
        assert len(result.offload) > 3 and any(r.hit_rate < 1.0 for r in result.offload.values())
        finish = {r.job_id: r.segments[-1].finish_s for r in result.records if r.segments}
        got_rates = _hit_rates(stats, finish)
        assert got_rates.keys() == {j for j, r in result.offload.items() if r.run_s > 0}
        for jid, rate in got_rates.items():
            assert rate == pytest.approx(result.offload[jid].hit_rate, rel=1e-9), jid
    expected = _simulate(tmp_path, cluster, policy, "milp", offload, preempt).read_text()
    got = (tmp_path / "up.csv").read_text()
    starts = [line.split(",")[:5] for line in expected.splitlines()]
    ids = [s[0] for s in starts[1:]]
    assert len(set(ids)) == LIMIT
    if preempt:  # stopped and started again: a row per run segment
        assert len(ids) - LIMIT > 20
    else:
        assert len(ids) == LIMIT
    assert sum(1 for s in starts[1:] if s[3] and float(s[3]) > float(s[2])) > 5  # jobs queued
    assert got == expected


async def test_lockstep_periodic_rounds_same_as_simulate(bus: BusSettings, tmp_path: Path) -> None:
    """With rounds every 10 minutes (what `rltune up` does in real time, at its own
    interval), the bus still gives `simulate --round-interval`'s per-job CSV, and the
    run is not the event-driven one: some starts moved to the next tick."""
    cluster = small_cluster(tmp_path)
    await publish_trace(bus, cluster, LIMIT)
    runs = lockstep_runs(bus, cluster, "sjf-est", "milp", LIMIT, tmp_path, round_interval_s=600)
    async with services(bus, runs) as tasks:
        await asyncio.wait_for(tasks["cluster-sim"], 240)
    expected = _simulate(tmp_path, cluster, "sjf-est", "milp", 0.0, False, 600.0).read_text()
    assert (tmp_path / "up.csv").read_text() == expected
    starts = [line.split(",")[3] for line in expected.splitlines()[1:]]
    assert sum(1 for t in starts if t) > 40
    assert all(float(t) % 600 == 0 for t in starts if t)
    event_driven = _simulate(tmp_path, cluster, "sjf-est", "milp", 0.0, False).read_text()
    assert event_driven != expected


async def test_forged_round_answers_are_refused_and_change_nothing(
    bus: BusSettings, tmp_path: Path
) -> None:
    """Before the run, someone publishes well-formed answers to rounds not asked yet: a
    placement of the first jobs onto the first node and a priority batch in reverse
    order. cluster-sim refuses both (dead letters naming the round) and the per-job
    CSV is exactly `simulate`'s."""
    t = bus.topics
    cluster = small_cluster(tmp_path)
    await publish_trace(bus, cluster, LIMIT)
    sim_csv = _simulate(tmp_path, cluster, "sjf-est", "greedy", 0.0, False).read_text()
    ids = [line.split(",")[0] for line in sim_csv.splitlines()[1:]]
    everyone = [(j, float(i)) for i, j in enumerate(ids)]
    place = PlacementBatch(12, 0.0, [Assignment(ids[5], "v100-0", [0, 1, 2, 3])])
    prio = PriorityBatch(13, 0.0, everyone, driven=True)
    async with Producer(bus) as p:
        await (await p.send(t.sched_placements, "12", encode(place)))
        await (await p.send(t.sched_priorities, "13", encode(prio)))
    runs = lockstep_runs(bus, cluster, "sjf-est", "greedy", LIMIT, tmp_path)
    async with services(bus, runs) as tasks:
        await asyncio.wait_for(tasks["cluster-sim"], 240)
    dead: list[Record] = []
    await read_back(
        bus, [t.dead_letter(t.sched_placements), t.dead_letter(t.sched_priorities)], dead.append
    )
    reasons = sorted(msgspec.json.decode(r.value or b"", type=Rejection).reason for r in dead)
    assert len(reasons) == 2
    assert "placements for round 12, which was never asked" in reasons[0]
    assert "priorities for round 13, which was never asked" in reasons[1]
    assert (tmp_path / "up.csv").read_text() == sim_csv
