"""A metrics snapshot the broker will not take never stops a service, nor holds it up:
the failure is logged once (as an outage, shared.health.BROKER) and the service goes
on answering while the publish waits out its timeout."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.arrival import service as arrival
from shared.config import BusSettings
from shared.health import BROKER
from shared.topics import Topics
from tests.integration.test_bus_reliability import _records, _send, _until

BAD_TOPIC = "no such topic!"  # a space and a "!": not a legal Kafka topic name


async def test_a_failed_metrics_publish_is_logged_once_and_not_fatal(
    bus: BusSettings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(Topics, "metrics", property(lambda self: BAD_TOPIC))
    monkeypatch.setattr(BROKER, "down_since", None)  # a fresh outage state for this test
    # aiokafka retries the metadata of an illegal topic until the publish's own timeout;
    # 1 s until the first failure is seen, then 120 s: the loop must not wait for it
    monkeypatch.setattr("shared.bus._METRICS_TIMEOUT_S", 1.0)
    caplog.set_level(logging.WARNING, logger="rltune.bus")
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    try:
        await asyncio.wait_for(ready.wait(), 60)

        async def answered(n: int) -> bool:
            return len(await _records(bus, bus.topics.jobs_accepted)) >= n

        await _send(bus, [(b"m1", b'{"job_id": "m1", "num_gpus": 1}')])
        await _until("m1 accepted", lambda: answered(1), 30)

        def failures() -> list[str]:
            return [r.getMessage() for r in caplog.records if "metrics publish" in r.getMessage()]

        async def failed() -> bool:
            return bool(failures())

        await _until("a metrics publish failed", failed, 30)
        monkeypatch.setattr("shared.bus._METRICS_TIMEOUT_S", 120.0)
        await asyncio.sleep(5)  # more snapshots (every 2 s) fail meanwhile; one now hangs
        assert not task.done(), task
        await _send(bus, [(b"m2", b'{"job_id": "m2", "num_gpus": 1}')])
        await _until("m2 accepted while a publish hangs", lambda: answered(2), 30)
        assert not task.done(), task
        assert len(failures()) == 1, failures()
        assert failures()[0].startswith("Kafka broker unreachable (metrics publish")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
