"""A broker outage is waited out by every service, however long: the lockstep
pipeline (arrival, scoring, placement, cluster-sim) with telemetry and the
profiler beside it runs on a broker of its own; the broker is stopped for 3 s or
45 s and started again on the same port (memory storage: it comes back empty,
the harshest case). Every service must still be running afterwards, stop within
a few seconds when asked, and leave no "Future exception was never retrieved"
behind (an output published outside the bus's retry loop did, and cluster-sim
and telemetry exited with UnknownError / NodeNotReadyError)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from pathlib import Path

import pytest

from services.profiler import service as profiler
from services.telemetry import service as telemetry
from shared.broker import EmbeddedBroker, ensure_topics
from shared.config import BusSettings
from tests.integration.streaming import lockstep_runs, small_cluster

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("down_s", [3.0, 45.0])
async def test_every_service_lives_through_an_outage(
    tmp_path: Path, down_s: float, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    broker = await asyncio.to_thread(EmbeddedBroker(log_path=tmp_path / "tansu.log").start)
    settings = BusSettings(bootstrap=broker.bootstrap, topic_prefix="outage.")
    try:
        await ensure_topics(settings)
        runs = lockstep_runs(
            settings, small_cluster(tmp_path), "sjf-est", "greedy", 3_000, tmp_path
        )
        runs["telemetry"] = lambda stop: telemetry.serve(settings, stop)
        runs["profiler"] = lambda stop: profiler.serve(settings, stop)
        stop = asyncio.Event()
        tasks = {n: asyncio.create_task(run(stop), name=n) for n, run in runs.items()}
        try:
            await asyncio.sleep(10)  # rounds under way
            assert not [n for n, t in tasks.items() if t.done()], "a service ended early"
            broker.stop()
            await asyncio.sleep(down_s)
            again = EmbeddedBroker(port=broker.port, log_path=tmp_path / "tansu2.log")
            broker = await asyncio.to_thread(again.start)
            await ensure_topics(settings)
            await asyncio.sleep(10)
            ended = {n: t.exception() for n, t in tasks.items() if t.done()}
            assert not ended, f"services that ended through the outage: {ended}"
        finally:
            stop.set()
            t0 = time.monotonic()
            results = await asyncio.wait_for(
                asyncio.gather(*tasks.values(), return_exceptions=True), 60
            )
            took = time.monotonic() - t0
        errors = {n: r for n, r in zip(tasks, results, strict=True) if isinstance(r, BaseException)}
        assert not errors
        assert took < 15, f"shutdown took {took:.1f} s after the outage"
    finally:
        broker.stop()
    gc.collect()
    await asyncio.sleep(0)
    never = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert not never
