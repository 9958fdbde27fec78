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
from shared.messages import JobEvent, JobSpec

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


async def test_readme_script_submits_and_follows_its_job_to_the_end(bus: BusSettings) -> None:
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
        key, value = records[0]
        assert key == b"train-42"
        spec = msgspec.json.decode(value, type=JobSpec)  # what arrival decodes it with
        assert (spec.job_id, spec.num_gpus, spec.gpu_types) == ("train-42", 4, ["V100", "A100"])

        # what a host agent would publish: another job's end (not printed), this job's
        # start and end (the script stops there), and a later event it never reads
        events = [
            JobEvent(job_id="other-1", kind="finished", time=5.0),
            JobEvent(job_id="train-42", kind="started", time=10.0, node_ids=["v100-0"]),
            JobEvent(job_id="train-42", kind="finished", time=70.0, node_ids=["v100-0"]),
            JobEvent(job_id="train-42", kind="failed", time=80.0),
        ]
        producer = AIOKafkaProducer(bootstrap_servers=bus.bootstrap)
        await producer.start()
        try:
            for e in events:
                await producer.send_and_wait(
                    bus.topics.jobs_events, msgspec.json.encode(e), key=e.job_id.encode()
                )
        finally:
            await producer.stop()
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert out.decode().splitlines() == [
        "started 10.0 ['v100-0'] ",
        "finished 70.0 ['v100-0'] ",
    ]
