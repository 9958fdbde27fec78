"""The usage ledger as a faust-streaming table on the real broker: its rows equal a
reference sum written here in a few lines, and after a restart the table comes back
from its changelog while the consumer resumes where it stopped (it does not read
`jobs.events` again from its start)."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from services.ledger.service import LedgerSettings, read_usage, serve
from services.scoring.service import ScoringHandler, ScoringSettings
from shared.bus import ServiceStats, read_back
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.fairshare import factors, usage_changelog
from shared.messages import Job, JobEvent, encode

H = 3600.0  # tests/data: a one-hour half-life (cluster file below)


def reference(segments: list[tuple[str, float, float, float]], t: float) -> dict[str, float]:
    """Σ over (queue, gpus, start, end) of ∫ gpus · 2^-((t - x)/H) dx over [start, end]."""
    out: dict[str, float] = {}
    k = math.log(2) / H
    for q, g, s, e in segments:
        out[q] = out.get(q, 0.0) + g / k * (math.exp(-k * (t - e)) - math.exp(-k * (t - s)))
    return out


async def _publish(bus: BusSettings, records: list[tuple[str, bytes, bytes]]) -> None:
    p = AIOKafkaProducer(**bus.client_kwargs())
    await p.start()
    try:
        for topic, key, value in records:
            await p.send_and_wait(topic, value, key=key)
    finally:
        await p.stop()


async def _run_until(bus: BusSettings, conf: LedgerSettings, applied: int) -> ServiceStats:
    stop, stats = asyncio.Event(), ServiceStats()
    task = asyncio.create_task(serve(bus, stop, conf=conf, stats=stats))
    deadline = time.monotonic() + 90
    while stats.extra["changes_applied"] < applied and time.monotonic() < deadline:
        assert not task.done(), task.exception()
        await asyncio.sleep(0.1)
    await asyncio.sleep(3.0)  # commit intervals (0.5 s) pass: offsets and changelogs out
    stop.set()
    await task
    return stats


async def test_ledger_table_matches_reference_and_survives_a_restart(
    bus: BusSettings, tmp_path: Path
) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "nodes: [{name: n, count: 4, gpu_type: V100, gpus: 8}]\n"
        "queues:\n  org: {}\n  nlp: {parent: org}\n  cv: {parent: org}\n"
        "fair_share: {half_life_h: 1}\n"
    )
    conf = LedgerSettings(str(cluster))
    t = bus.topics
    jobs = {"a": ("nlp", 4), "b": ("cv", 2), "c": ("nlp", 1), "d": ("other", 8)}
    first: list[tuple[str, str, Job | JobEvent]] = [
        (t.jobs_accepted, j, Job(j, g, 0.0, vc=vc)) for j, (vc, g) in jobs.items()
    ]
    first += [
        (t.jobs_events, "a", JobEvent("a", "started", 0.0)),
        (t.jobs_events, "b", JobEvent("b", "started", 100.0)),
        (t.jobs_events, "a", JobEvent("a", "preempted", 1800.0)),
        (t.jobs_events, "a", JobEvent("a", "started", 2000.0)),
        (t.jobs_events, "c", JobEvent("c", "started", 2500.0)),
        (t.jobs_events, "b", JobEvent("b", "finished", 3000.0)),
    ]
    await _publish(bus, [(tp, k.encode(), encode(m)) for tp, k, m in first])
    s1 = await _run_until(bus, conf, applied=6)
    assert s1.extra[f"read_{t.jobs_events}"] == 6
    assert s1.extra[f"first_offset_{t.jobs_events}"] == 0

    rows = await read_usage(bus)
    # at 3000: a ran [0, 1800] and [2000, 3000] (4 GPUs), c [2500, 3000], b [100, 3000]
    want = reference(
        [("nlp", 4, 0, 1800), ("nlp", 4, 2000, 3000), ("nlp", 1, 2500, 3000),
         ("cv", 2, 100, 3000)],
        3000.0,
    )  # fmt: skip
    assert set(rows) == {"nlp", "cv"}
    for q, u in want.items():
        assert rows[q].at(3000.0, H) == pytest_approx(u)
    assert rows["nlp"].gpus == 5 and rows["cv"].gpus == 0

    # the service stops; more happens; it starts again: the table comes back from its
    # changelog, and only the new events are read
    second: list[tuple[str, str, Job | JobEvent]] = [
        (t.jobs_events, "a", JobEvent("a", "finished", 5000.0)),
        (t.jobs_events, "c", JobEvent("c", "finished", 6000.0)),
        (t.jobs_events, "d", JobEvent("d", "started", 6000.0)),
        (t.jobs_events, "d", JobEvent("d", "failed", 6600.0)),
    ]
    await _publish(bus, [(tp, k.encode(), encode(m)) for tp, k, m in second])
    s2 = await _run_until(bus, conf, applied=4)
    rows = await read_usage(bus)
    want = reference(
        [("nlp", 4, 0, 1800), ("nlp", 4, 2000, 5000), ("nlp", 1, 2500, 6000),
         ("cv", 2, 100, 3000), ("default", 8, 6000, 6600)],
        7200.0,
    )  # fmt: skip
    assert set(rows) == {"nlp", "cv", "default"}  # "other" has no queue: default's
    for q, u in want.items():
        assert rows[q].at(7200.0, H) == pytest_approx(u)
    assert all(r.gpus == 0 for r in rows.values())
    # it resumed at its committed offsets, not at the start: the first event it read is
    # a new one (or the last of the first run, had the stop come before its commit).
    # Events read twice (faust reads again from the committed offset after its seek)
    # count as duplicates and change nothing; an event faust dropped is read by the
    # ledger itself (gap_records_applied)
    resumed = s2.extra[f"first_offset_{t.jobs_events}"]
    assert resumed >= 5, dict(s2.extra)
    dup, gap = s2.extra["duplicate_events"], s2.extra["gap_records_applied"]
    assert s2.extra[f"read_{t.jobs_events}"] - dup + gap == 4, dict(s2.extra)  # 6 to 9, once
    assert s2.extra["changes_applied"] == 4
    assert s2.extra[f"read_{t.jobs_accepted}"] == 0

    # scoring --ledger reads the table from its changelog: its fair-share factors are
    # Slurm's over the reference usage
    scoring = ScoringHandler(
        bus, ServiceStats(), ScoringSettings(policy="drf", cluster=str(cluster), ledger=True)
    )
    await read_back(bus, [usage_changelog(bus.topic_prefix)], scoring.replay)
    got = scoring.state.fair.factors(7200.0)
    assert got == pytest_approx_map(factors(want, load_cluster(str(cluster)).queues))
    scoring.state.fair.change("nlp", 7200.0, 64.0)  # ignored: the table is the source
    assert scoring.state.fair.factors(7300.0)["nlp"] == pytest_approx(
        factors(
            {q: u * 2 ** (-100 / H) for q, u in want.items()}, load_cluster(str(cluster)).queues
        )["nlp"]
    )


async def _commit(bus: BusSettings, group: str, offsets: dict[str, int]) -> None:
    """Commit `offsets` (topic: next offset, partition 0) for the consumer `group`, the
    way a consumer that skipped records would have: as a member of the group (the
    ledger is stopped, so the group is empty). The embedded broker refuses a commit
    from outside the group, and a member whose protocol is not the group's last one
    (faust's), hence the assignor named "faust"."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.structs import OffsetAndMetadata

    class Faust(RoundRobinPartitionAssignor):
        name = "faust"

    c = AIOKafkaConsumer(
        **bus.client_kwargs(),
        group_id=group,
        enable_auto_commit=False,
        partition_assignment_strategy=(Faust,),
        rebalance_timeout_ms=3000,  # the embedded broker waits it out
        session_timeout_ms=10000,
        heartbeat_interval_ms=1000,
    )
    await c.start()
    try:
        tps = {topic: TopicPartition(topic, 0) for topic in offsets}
        c.subscribe(list(tps))
        async with asyncio.timeout(60):
            while set(c.assignment()) != set(tps.values()):
                await c.getmany(timeout_ms=200)
        await c.commit({tps[k]: OffsetAndMetadata(v, "") for k, v in offsets.items()})
        for k, v in offsets.items():
            assert await c.committed(tps[k]) == v
    finally:
        await c.stop()


async def test_records_the_consumer_skipped_are_applied(bus: BusSettings, tmp_path: Path) -> None:
    """The ledger's consumer group commits past records the agent never got (faust drops
    what sits in the agent's queue when recovery ends: docs/design/fair-share.md). Here
    the committed offsets skip records directly: one with a later record behind it
    (the agent sees the gap, unless faust drops that one too), then the last records
    of both inputs (nothing follows: the idle repair sees the partitions' ends). Every
    one is applied, once."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "nodes: [{name: n, count: 4, gpu_type: V100, gpus: 8}]\n"
        "queues:\n  nlp: {}\n  cv: {}\nfair_share: {half_life_h: 1}\n"
    )
    conf = LedgerSettings(str(cluster))
    t = bus.topics
    group = f"{bus.topic_prefix}ledger"  # the app id, also the consumer group

    def publish(msgs: list[tuple[str, str, Job | JobEvent]]) -> list[tuple[str, bytes, bytes]]:
        return [(tp, k.encode(), encode(m)) for tp, k, m in msgs]

    await _publish(
        bus,
        publish(
            [
                (t.jobs_accepted, "a", Job("a", 4, 0.0, vc="nlp")),
                (t.jobs_accepted, "b", Job("b", 2, 0.0, vc="cv")),
                (t.jobs_events, "a", JobEvent("a", "started", 0.0)),
                (t.jobs_events, "b", JobEvent("b", "started", 100.0)),
            ]
        ),
    )
    s1 = await _run_until(bus, conf, applied=2)
    assert s1.extra["gap_records_applied"] == 0

    # a's stop (offset 2) is skipped, b's stop (3) is read: the agent meets the gap
    await _publish(
        bus,
        publish(
            [
                (t.jobs_events, "a", JobEvent("a", "finished", 1000.0)),
                (t.jobs_events, "b", JobEvent("b", "finished", 2000.0)),
            ]
        ),
    )
    await _commit(bus, group, {t.jobs_events: 3})
    s2 = await _run_until(bus, conf, applied=2)
    rows = await read_usage(bus)
    want = reference([("nlp", 4, 0, 1000), ("cv", 2, 100, 2000)], 4000.0)
    assert set(rows) == {"nlp", "cv"}
    for q, u in want.items():
        assert rows[q].at(4000.0, H) == pytest_approx(u)
    assert all(r.gpus == 0 for r in rows.values())
    # offset 2 is read by the ledger itself; so is 3 when faust drops it in turn
    # (the cause, at the end of recovery), the idle repair then reading both
    gap2 = s2.extra["gap_records_applied"]
    assert gap2 >= 1, dict(s2.extra)
    assert s2.extra[f"read_{t.jobs_events}"] - s2.extra["duplicate_events"] + gap2 == 2
    assert _gap_metric(t.jobs_events) == gap2  # rltune_ledger_gap_records_total{topic}

    # the last records of both inputs are skipped: c's accepted record and its two
    # events; the agent reads nothing, and the ends of the partitions show them
    await _publish(
        bus,
        publish(
            [
                (t.jobs_accepted, "c", Job("c", 1, 0.0, vc="cv")),
                (t.jobs_events, "c", JobEvent("c", "started", 3000.0)),
                (t.jobs_events, "c", JobEvent("c", "finished", 3600.0)),
            ]
        ),
    )
    await _commit(bus, group, {t.jobs_accepted: 3, t.jobs_events: 6})
    s3 = await _run_until(bus, conf, applied=2)
    rows = await read_usage(bus)
    want = reference([("nlp", 4, 0, 1000), ("cv", 2, 100, 2000), ("cv", 1, 3000, 3600)], 4000.0)
    for q, u in want.items():
        assert rows[q].at(4000.0, H) == pytest_approx(u)
    assert all(r.gpus == 0 for r in rows.values())
    assert s3.extra["gap_records_applied"] == 3, dict(s3.extra)
    assert (_gap_metric(t.jobs_accepted), _gap_metric(t.jobs_events)) == (1, gap2 + 2)
    assert s3.extra["changes_applied"] == 2
    assert s3.extra[f"read_{t.jobs_events}"] == s3.extra["duplicate_events"]  # none new


def _changelog_raw(bootstrap: str, topic: str) -> tuple[list[int], int]:
    """The changelog read with kafka-python until it stays quiet (no end asked of the
    broker): every record's offset; and the end ListOffsets answers, the end faust's
    recovery reads up to."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        offsets: list[int] = []
        quiet = 0
        while quiet < 3:
            got = c.poll(timeout_ms=500)
            quiet = 0 if got else quiet + 1
            offsets += [r.offset for rs in got.values() for r in rs]
        return offsets, c.end_offsets([tp])[tp]
    finally:
        c.close()


async def test_restart_recovers_every_write_of_a_burst(bus: BusSettings, tmp_path: Path) -> None:
    """A burst of events makes many table writes at once. faust's recovery reads each
    changelog up to the end ListOffsets answers; the embedded broker answers the first
    offset of the last record batch plus one, so writes batched together at the end
    came back missing after a restart (their jobs then never stopped counting). With
    one record per batch the listed end is each changelog's true end, and the table
    after the restart is the reference sum."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "nodes: [{name: n, count: 4, gpu_type: V100, gpus: 8}]\n"
        "queues:\n  nlp: {}\n  cv: {}\nfair_share: {half_life_h: 1}\n"
    )
    conf = LedgerSettings(str(cluster))
    t = bus.topics
    n = 24
    spec = {f"j{i}": ("nlp" if i % 2 else "cv", 1 + i % 3, 10.0 * i) for i in range(n)}
    first: list[tuple[str, str, Job | JobEvent]] = [
        (t.jobs_accepted, j, Job(j, g, 0.0, vc=vc)) for j, (vc, g, _) in spec.items()
    ]
    first += [(t.jobs_events, j, JobEvent(j, "started", s)) for j, (_, _, s) in spec.items()]
    await _publish(bus, [(tp, k.encode(), encode(m)) for tp, k, m in first])
    await _run_until(bus, conf, applied=n)

    # what faust's recovery will read up to covers every record the changelogs hold
    for name in ("jobs", "usage"):
        topic = f"{bus.topic_prefix}ledger-{name}-changelog"
        offsets, end = await asyncio.to_thread(_changelog_raw, bus.bootstrap, topic)
        assert offsets == list(range(len(offsets))) and len(offsets) >= n, (topic, offsets)
        assert end == len(offsets), (topic, end, len(offsets))

    second = [
        (t.jobs_events, j, JobEvent(j, "finished", 1000.0 + s)) for j, (_, _, s) in spec.items()
    ]
    await _publish(bus, [(tp, k.encode(), encode(m)) for tp, k, m in second])
    s2 = await _run_until(bus, conf, applied=n)
    assert s2.extra["changes_applied"] == n, dict(s2.extra)
    rows = await read_usage(bus)
    want = reference([(vc, g, s, 1000.0 + s) for vc, g, s in spec.values()], 2000.0)
    assert set(rows) == {"nlp", "cv"}
    for q, u in want.items():
        assert rows[q].at(2000.0, H) == pytest_approx(u)
    assert all(r.gpus == 0 for r in rows.values())


def _gap_metric(topic: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("rltune_ledger_gap_records_total", {"topic": topic}) or 0.0


def pytest_approx_map(x: dict[str, float]) -> object:
    return pytest.approx(x, rel=1e-9)


def pytest_approx(x: float) -> object:
    return pytest.approx(x, rel=1e-9)
