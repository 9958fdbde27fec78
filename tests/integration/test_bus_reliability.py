"""The bus's reliability on the real broker, one test per way it once failed: rejections
that outgrow what Apache Kafka takes, answers Kafka would refuse, a recreated topic,
two instances overlapping, hostile messages that escaped validation."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import msgspec
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from services.arrival import service as arrival
from services.arrival.admission import Admission
from shared.bus import MAX_REJECTION_BYTES, MAX_REQUEST_BYTES, Record, read_back
from shared.config import BusSettings
from shared.health import HEALTH
from shared.messages import Job, Rejection
from tests.integration.arrival_load import collect_answers, produce, service_counters

APACHE_KAFKA_MAX = 1_048_588  # message.max.bytes, Apache Kafka's default


async def _records(bus: BusSettings, topic: str) -> list[Record]:
    got: list[Record] = []
    await read_back(bus, [topic], got.append)
    return got


async def _until(what: str, check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"not within {timeout_s} s: {what}")


async def _send(bus: BusSettings, items: list[tuple[bytes | None, bytes]], **kw: int) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bus.bootstrap, max_request_size=8 << 20)
    await p.start()
    try:
        for key, value in items:
            await (await p.send(bus.topics.jobs_submit, value, key=key, **kw))
    finally:
        await p.stop()


async def test_rejections_stay_small_and_keep_the_input_key(bus: BusSettings) -> None:
    """A control byte is six bytes once escaped: a 1,000,000-byte input used to give a
    6 MB rejection, which Apache Kafka refuses; and unparsable input lost its key."""
    inputs = [
        (b"ctl-200k", b"\x01" * 200_000),
        (b"ctl-1m", b"\x01" * 1_000_000),
        (b"bin", b"\xff\xfe" * 40_000),
        (b"too-big", b'{"job_id": "x", "pad": "' + b"\x01" * (2 << 20) + b'"}'),
    ]
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    try:
        await _send(bus, inputs)
        await collect_answers(bus, len(inputs), timeout_s=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    recs = await _records(bus, bus.topics.jobs_rejected)
    assert sorted(r.key or b"" for r in recs) == sorted(k for k, _ in inputs)
    by_key = {r.key: r for r in recs}
    for key, value in inputs:
        rec = by_key[key]
        size = len(rec.value or b"") + len(rec.key or b"")
        assert size <= MAX_REJECTION_BYTES < APACHE_KAFKA_MAX
        rej = msgspec.json.decode(rec.value or b"", type=Rejection)
        if rej.raw.startswith("base64:"):
            assert value.startswith(__import__("base64").b64decode(rej.raw[7:]))
        else:
            assert value.startswith(rej.raw.encode())
        assert len(rej.raw) > 1000  # cut, not emptied
        assert f"of {len(value)} bytes" in rej.reason


async def test_an_answer_kafka_would_refuse_becomes_a_dead_letter(bus: BusSettings) -> None:
    """A valid spec just under the 1 MiB input limit makes an accepted Job over Apache
    Kafka's message.max.bytes: the service must not publish it (Kafka would refuse it
    and the input would never be committed) but answer with a dead letter, and go on."""

    def spec(last: int) -> bytes:
        cmd = ["x" * 4096] * 255 + ["y" * last]
        return msgspec.json.encode({"job_id": "huge-cmd", "num_gpus": 1, "command": cmd})

    value = spec(1)
    value = spec(1 + (1 << 20) - 60 - len(value))  # 60 bytes under the input limit
    job = Admission().admit(value, 0.0)
    assert len(msgspec.json.encode(job)) > MAX_REQUEST_BYTES  # the Job is the larger
    assert len(value) <= 1 << 20
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    try:
        await _send(bus, [(b"huge-cmd", value), (b"after", b'{"job_id": "after", "num_gpus": 1}')])
        got = await collect_answers(bus, 2, timeout_s=60)
        assert not task.done()
    finally:
        stop.set()
        stats = await asyncio.wait_for(task, 30)
    assert got.accepted == {"after": 1}
    assert len(got.rejected) == 1 and "could not be published" in got.reasons[0]
    assert stats.rejected["unpublishable"] == 1
    for topic in (bus.topics.jobs_accepted, bus.topics.jobs_rejected):
        for r in await _records(bus, topic):
            assert len(r.value or b"") + len(r.key or b"") <= MAX_REQUEST_BYTES


async def test_a_recreated_topic_is_answered_again(bus: BusSettings) -> None:
    """Answered inputs were keyed by topic, partition and offset only: after jobs.submit
    was deleted and recreated, new messages at answered offsets were skipped."""
    first = [b'{"job_id": "old-%d", "num_gpus": 1}' % i for i in range(150)]
    second = [b'{"job_id": "new-%d", "num_gpus": 1}' % i for i in range(150)]
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    await produce(bus, first)
    await collect_answers(bus, 150, timeout_s=60)
    stop.set()
    await asyncio.wait_for(task, 30)

    admin = AIOKafkaAdminClient(bootstrap_servers=bus.bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([bus.topics.jobs_submit])
        await asyncio.sleep(1.0)
        await admin.create_topics([NewTopic(bus.topics.jobs_submit, 1, 1)])
    finally:
        await admin.close()
    await produce(bus, second)
    for group in (None, bus.topic_prefix + "fresh"):  # the same group, then a new one
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(arrival.serve(bus, stop, ready, group_id=group))
        got = await collect_answers(bus, 300, timeout_s=60)
        if group is not None:  # every input again: all answered already, all skipped

            async def skipped() -> bool:
                snaps = await service_counters(bus, "arrival")
                return bool(snaps) and snaps[-1].get("skipped_redelivered", 0) >= 150

            await _until("the fresh group skips the 150 answered inputs", skipped, 60)
        stop.set()
        stats = await asyncio.wait_for(task, 30)
        assert got.accepted == dict.fromkeys([f"old-{i}" for i in range(150)], 1) | dict.fromkeys(
            [f"new-{i}" for i in range(150)], 1
        )
        assert stats.skipped_redelivered == (0 if group is None else 150)


def _service(bus: BusSettings, name: str) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, RLTUNE_BOOTSTRAP_SERVERS=bus.bootstrap, RLTUNE_TOPIC_PREFIX=bus.topic_prefix
    )
    return subprocess.Popen(
        [sys.executable, "-m", "shared.cli", "service", name],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def test_overlapping_instances_never_accept_a_live_job_twice(bus: BusSettings) -> None:
    """A rolling update: a second instance starts while the first still runs, then the
    first stops. The second read its live-job set at start-up, before the first's
    last acceptances, and accepted their duplicates."""
    originals = [b'{"job_id": "live-%d", "num_gpus": 1}' % i for i in range(300)]
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))  # instance A, in-process
    await asyncio.wait_for(ready.wait(), 60)
    other = _service(bus, "arrival")  # instance B, same group
    try:
        await asyncio.sleep(8.0)  # B joins the group: one of the two holds the partition
        await produce(bus, originals)
        await collect_answers(bus, 300, timeout_s=90)
        # stop whichever holds the partition; the other takes over
        if HEALTH["arrival"].assigned:
            stop.set()
            await asyncio.wait_for(task, 30)
        else:
            other.send_signal(signal.SIGTERM)
            assert other.wait(30) == 0
        await produce(bus, originals[::3])  # duplicates of live jobs
        got = await collect_answers(bus, 400, timeout_s=90)
        assert got.accepted == dict.fromkeys([f"live-{i}" for i in range(300)], 1)
        assert sum(got.rejected.values()) == 100
        assert all("duplicates a live job" in r for r in got.reasons)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        if other.poll() is None:
            other.send_signal(signal.SIGTERM)
            other.wait(30)


async def test_hostile_specs_are_rejected_with_reasons_and_jobs_carry_every_field(
    bus: BusSettings,
) -> None:
    inputs: list[tuple[bytes | None, bytes]] = [
        (b"nl", b'{"job_id": "nl\\n", "num_gpus": 1}'),
        (b"deep", b'{"job_id": "deep", "num_gpus": 1, "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"),
        (b"utf-known", b'{"job_id": "u1", "num_gpus": 1, "user": "\xff\xfe"}'),
        (b"utf-unknown", b'{"job_id": "u2", "num_gpus": 1, "zz": "\xff"}'),
        (b"garbage-key", b"\x00\x01 not json"),
        (b"nulls", b'{"job_id": "nulls", "num_gpus": 1, "user": null, "duration_hint_s": null}'),
        (b"plain", b'{"job_id": "plain", "num_gpus": 2}'),
    ]
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    try:
        await _send(bus, inputs[:-1])
        await _send(bus, inputs[-1:], timestamp_ms=-1)  # a record without a timestamp
        got = await collect_answers(bus, len(inputs), timeout_s=60)
    finally:
        stop.set()
        stats = await asyncio.wait_for(task, 30)
    assert set(got.accepted) == {"nulls", "plain"}
    assert "internal_error" not in stats.rejected
    rejected = {r.key: msgspec.json.decode(r.value or b"", type=Rejection) for r in
                await _records(bus, bus.topics.jobs_rejected)}  # fmt: skip
    assert set(rejected) == {b"nl", b"deep", b"utf-known", b"utf-unknown", b"garbage-key"}
    assert "$.job_id" in rejected[b"nl"].reason
    assert "nested too deeply" in rejected[b"deep"].reason
    assert "UTF-8" in rejected[b"utf-known"].reason and "UTF-8" in rejected[b"utf-unknown"].reason
    fields = set(Job.__struct_fields__)
    for r in await _records(bus, bus.topics.jobs_accepted):
        obj = msgspec.json.decode(r.value or b"")
        assert set(obj) == fields  # every field, defaults and nulls included
        assert obj["submit_time"] >= 0
        assert obj["weight"] == 1.0 and obj["gpu_milli"] == 1000 and obj["user"] == ""
