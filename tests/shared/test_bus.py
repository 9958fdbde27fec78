"""Reading a topic back to its end on the real broker, whatever its batches look like."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from shared.bus import read_back
from shared.config import BusSettings


async def _publish(settings: BusSettings, topic: str, batches: list[int]) -> list[bytes]:
    """`batches[i]` records sent as one record batch each (one linger window, and
    batches up to 1 MiB, as the services' own producer sends them)."""
    sent: list[bytes] = []
    p = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap, linger_ms=200, max_batch_size=1 << 20
    )
    await p.start()
    try:
        for i, n in enumerate(batches):
            values = [f"{i}:{k}".encode() for k in range(n)]
            futures = [await p.send(topic, v, partition=0) for v in values]
            await asyncio.gather(*futures)
            sent += values
    finally:
        await p.stop()
    return sent


@pytest.mark.parametrize("batches", [[1], [100, 50], [12_000], [7, 25_000]])
async def test_read_back_sees_every_record_of_the_last_batch(
    bus: BusSettings, batches: list[int]
) -> None:
    """Last batches larger than one fetch returns (10,000 records) included: the
    embedded broker lists the last batch's first offset + 1 as the log's end."""
    topic = bus.topics.metrics
    sent = await _publish(bus, topic, batches)
    got: list[bytes] = []
    counts = await read_back(bus, [topic], lambda rec: got.append(rec.value or b""))
    assert got == sent and counts == {topic: len(sent)}
