"""The bus's reliability on the real broker, one test per way it once failed: rejections
that outgrow what Apache Kafka takes, answers Kafka would refuse, a recreated topic,
two instances overlapping, hostile messages that escaped validation."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import msgspec
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from services.arrival import service as arrival
from services.arrival.admission import Admission
from shared.bus import MAX_REJECTION_BYTES, MAX_REQUEST_BYTES, Record, read_back
from shared.config import BusSettings
from shared.health import HEALTH
from shared.messages import Job, Rejection
from tests.integration.arrival_load import collect_answers, produce

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


async def _send(bus: BusSettings, items: Sequence[tuple[bytes | None, bytes]], **kw: int) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bus.bootstrap, max_request_size=8 << 20)
    await p.start()
    try:
        for key, value in items:
            await (await p.send(bus.topics.jobs_submit, value, key=key, **kw))
    finally:
        await p.stop()


def _huge_command_spec() -> bytes:
    """A valid spec just under the 1 MiB input limit whose accepted Job is over it."""

    def spec(last: int) -> bytes:
        cmd = ["x" * 4096] * 255 + ["y" * last]
        return msgspec.json.encode({"job_id": "huge-cmd", "num_gpus": 1, "command": cmd})

    value = spec(1)
    value = spec(1 + (1 << 20) - 60 - len(value))  # 60 bytes under the input limit
    assert len(value) <= 1 << 20
    assert len(msgspec.json.encode(Admission().admit(value, 0.0))) > MAX_REQUEST_BYTES
    return value


# key -> the input, then what the service must answer to it
_OVERSIZED = [
    (b"ctl-200k", b"\x01" * 200_000),  # six times larger once escaped
    (b"ctl-1m", b"\x01" * 1_000_000),
    (b"bin", b"\xff\xfe" * 40_000),
    (b"too-big", b'{"job_id": "x", "pad": "' + b"\x01" * (2 << 20) + b'"}'),
]
_HOSTILE = [
    (b"nl", b'{"job_id": "nl\\n", "num_gpus": 1}'),
    (b"deep", b'{"job_id": "deep", "num_gpus": 1, "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"),
    (b"utf-known", b'{"job_id": "u1", "num_gpus": 1, "user": "\xff\xfe"}'),
    (b"utf-unknown", b'{"job_id": "u2", "num_gpus": 1, "zz": "\xff"}'),
    (b"garbage-key", b"\x00\x01 not json"),
    (b"nulls", b'{"job_id": "nulls", "num_gpus": 1, "user": null, "duration_hint_s": null}'),
]
_NO_TIMESTAMP = (b"plain", b'{"job_id": "plain", "num_gpus": 2}')  # sent with timestamp -1


async def test_hostile_inputs_get_bounded_keyed_answers_kafka_would_take(bus: BusSettings) -> None:
    """One arrival service, the inputs that once broke the bus:

    * a control byte is six bytes once escaped: a 1,000,000-byte input gave a 6 MB
      rejection, which Apache Kafka refuses (the input then never committed);
    * an unparsable input's rejection lost the input's key;
    * a valid spec just under 1 MiB makes a Job over Kafka's message.max.bytes: it
      must become a dead letter, not a publish that fails forever;
    * a job id ending in a newline was accepted; deep nesting and invalid UTF-8 in a
      known field escaped as internal errors, in an unknown field was accepted;
      `null` was accepted in some optional fields only; a record without a
      timestamp gave submit_time -0.001; the Job left out fields at their default.
    """
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    inputs = [*_OVERSIZED, *_HOSTILE, (b"huge-cmd", _huge_command_spec())]
    try:
        await _send(bus, inputs)
        await _send(bus, [_NO_TIMESTAMP], timestamp_ms=-1)
        got = await collect_answers(bus, len(inputs) + 1, timeout_s=60)
        assert not task.done()
    finally:
        stop.set()
        stats = await asyncio.wait_for(task, 30)
    assert set(got.accepted) == {"nulls", "plain"}
    assert "internal_error" not in stats.rejected
    assert stats.rejected["unpublishable"] == 1
    recs = await _records(bus, bus.topics.jobs_rejected)
    want_keys = {k for k, _ in inputs} - {b"nulls"}
    assert sorted(r.key or b"" for r in recs) == sorted(want_keys)  # the input's key
    by_key = {r.key: r for r in recs}
    rej = {k: msgspec.json.decode(r.value or b"", type=Rejection) for k, r in by_key.items()}
    for key, value in _OVERSIZED:
        size = len(by_key[key].value or b"") + len(key)
        assert size <= MAX_REJECTION_BYTES < APACHE_KAFKA_MAX
        raw = rej[key].raw
        head = base64.b64decode(raw[7:]) if raw.startswith("base64:") else raw.encode()
        assert value.startswith(head) and len(head) > 1000  # cut, not emptied
        assert f"of {len(value)} bytes" in rej[key].reason
    assert "could not be published" in rej[b"huge-cmd"].reason
    assert "$.job_id" in rej[b"nl"].reason
    assert "nested too deeply" in rej[b"deep"].reason
    assert "UTF-8" in rej[b"utf-known"].reason and "UTF-8" in rej[b"utf-unknown"].reason
    fields = set(Job.__struct_fields__)
    for topic in (bus.topics.jobs_accepted, bus.topics.jobs_rejected):
        for r in await _records(bus, topic):
            assert len(r.value or b"") + len(r.key or b"") <= MAX_REQUEST_BYTES
            if topic == bus.topics.jobs_accepted:
                obj = msgspec.json.decode(r.value or b"")
                assert set(obj) == fields  # every field, defaults and nulls included
                assert obj["submit_time"] >= 0
                assert obj["weight"] == 1.0 and obj["gpu_milli"] == 1000 and obj["user"] == ""


async def test_a_recreated_topic_is_answered_again(bus: BusSettings) -> None:
    """Answered inputs were keyed by topic, partition and offset only: after jobs.submit
    was deleted and recreated, a service reading it from the start (a new consumer
    group) took the new messages for the answered ones at the same offsets and
    skipped all 150. (Apache Kafka also drops a deleted topic's committed offsets, so
    the service's own group starts over too; the embedded broker keeps them.)"""
    first = [b'{"job_id": "old-%d", "num_gpus": 1}' % i for i in range(150)]
    second = [b'{"job_id": "new-%d", "num_gpus": 1}' % i for i in range(150)]
    every = dict.fromkeys([f"old-{i}" for i in range(150)] + [f"new-{i}" for i in range(150)], 1)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    try:
        await produce(bus, first)
        await collect_answers(bus, 150, timeout_s=60)
    finally:
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

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready, group_id=bus.topic_prefix + "new"))
    try:
        got = await collect_answers(bus, 300, timeout_s=90)
    finally:
        stop.set()
        stats = await asyncio.wait_for(task, 30)
    assert got.accepted == every and got.total == 300
    assert stats.skipped_redelivered == 0 and stats.published == 150


def _service(bus: BusSettings, name: str) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, RLTUNE_BOOTSTRAP_SERVERS=bus.bootstrap, RLTUNE_TOPIC_PREFIX=bus.topic_prefix
    )
    return subprocess.Popen(
        [sys.executable, "-m", "rltune", "service", name],
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
        await asyncio.sleep(5.0)  # B starts and joins: one of the two holds the partition
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
