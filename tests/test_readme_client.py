"""The README's client script (kafka-python), run as written (only the broker address and the topic
prefix changed) against the real broker: it publishes a JobSpec that the arrival
service's own decoder accepts, keyed by its job id, and follows `jobs.events` until its
job's `finished`, printing that job's events and no other job's."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from shared.config import BusSettings
from shared.messages import JobEvent, JobSpec, Rejection

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_script() -> str:
    """The README's one Python block."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
    assert len(blocks) == 1, "the README should hold exactly one Python block"
    return blocks[0]


async def submitted(bus: BusSettings, timeout_s: float) -> list[tuple[bytes, bytes]]:
    """Every record on `jobs.submit`, once there is at least one."""
    topic = bus.topics.jobs_submit
    consumer = AIOKafkaConsumer(bootstrap_servers=bus.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        batch = await consumer.getmany(timeout_ms=int(timeout_s * 1000))
        return [(r.key, r.value) for records in batch.values() for r in records]
    finally:
        await consumer.stop()


async def _run(bus: BusSettings, answers: list[tuple[str, bytes]]) -> tuple[JobSpec, int, str]:
    """Run the README's script; once its job is on `jobs.submit`, publish `answers`
    ((topic, JSON) with `{job}` standing for its job id); its spec, exit code and output."""
    prefix = bus.topic_prefix
    code = (
        readme_script().replace("localhost:9092", bus.bootstrap).replace('"rltune.', f'"{prefix}')
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        records = await submitted(bus, timeout_s=60)
        assert len(records) == 1
        _, value = records[0]
        spec = msgspec.json.decode(value, type=JobSpec)  # what arrival decodes it with
        producer = AIOKafkaProducer(bootstrap_servers=bus.bootstrap)
        await producer.start()
        try:
            for topic, body in answers:
                raw = body.replace(b"{job}", spec.job_id.encode())
                await producer.send_and_wait(topic, raw, key=spec.job_id.encode())
        finally:
            await producer.stop()
        out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    return spec, proc.returncode, out.decode()


def _event(job_id: str, kind: str, nodes: list[str], detail: str = "") -> bytes:
    e = JobEvent(job_id=job_id, kind=kind, time=1.0, node_ids=nodes, detail=detail)  # type: ignore[arg-type]
    return msgspec.json.encode(e)


async def test_readme_script_submits_and_follows_its_job_to_the_end(bus: BusSettings) -> None:
    """What a host agent would publish: another job's end (not printed), this job's start
    and end (the script stops there), and a later event it never reads."""
    t = bus.topics
    spec, _, out = await _run(
        bus,
        [
            (t.jobs_events, _event("other-1", "finished", [])),
            (t.jobs_events, _event("{job}", "started", ["host-0"], "host-0:2")),
            (t.jobs_events, _event("{job}", "finished", ["host-0"])),
            (t.jobs_events, _event("{job}", "failed", [])),
        ],
    )
    assert spec.job_id.startswith("hello-")
    assert (spec.num_gpus, spec.command) == (1, ["echo", "hello"])
    assert out.splitlines() == ["started ['host-0'] host-0:2", "finished ['host-0'] "]


async def test_readme_script_ends_on_a_rejection_with_its_reason(bus: BusSettings) -> None:
    """A job the cluster cannot hold is answered on jobs.rejected: the script prints the
    reason and stops (it used to wait out its timeout without a word)."""
    reason = "num_gpus: 1 GPU of a type no node has"
    rejection = Rejection(job_id="{job}", reason=reason, raw="")
    _, _, out = await _run(bus, [(bus.topics.jobs_rejected, msgspec.json.encode(rejection))])
    assert out.splitlines() == [f"rejected [] {reason}"]
