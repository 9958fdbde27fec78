"""`shared.serving.serve`, every service's entry point, on the real broker: what a
service adds (its tasks beside the loop, or its main work) starts with the consumer
and stops with it, and `ready` means what the services' callers wait on."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from shared.bus import Outgoing, Record, ServiceSpec, ServiceStats
from shared.config import BusSettings
from shared.serving import Serving, serve

LIMIT_S = 60.0


async def _send(settings: BusSettings, topic: str, values: list[bytes]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=settings.bootstrap)
    await p.start()
    try:
        for v in values:
            await p.send_and_wait(topic, v, partition=0)
    finally:
        await p.stop()


async def _until(cond: object, seconds: float = LIMIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not cond():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_tasks_beside_run_with_the_loop_and_stop_with_it(bus: BusSettings) -> None:
    """A ticker beside the loop sees the handled inputs while the service runs, is
    told to stop by the caller's `stop`, and has returned when `serve` returns."""
    t = bus.topics
    handled: list[bytes] = []
    ticks: list[int] = []
    ended: list[bool] = []

    def handle(rec: Record) -> list[Outgoing]:
        handled.append(rec.value or b"")
        return [Outgoing(t.jobs_events, "k", b"answer:" + (rec.value or b""))]

    async def ticker(s: Serving) -> None:
        while not s.stop.is_set():
            ticks.append(len(handled))
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # a task that takes its time to wind down is waited for
        ended.append(True)

    stats = ServiceStats()
    spec = ServiceSpec(name="serving-test", topics=[t.jobs_submit], handle=handle)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(bus, spec, stop, ready, stats=stats, beside=[ticker]))
    await asyncio.wait_for(ready.wait(), LIMIT_S)
    await _send(bus, t.jobs_submit, [b"a", b"b"])
    await _until(lambda: len(handled) == 2 and stats.published == 2)
    await _until(lambda: ticks and ticks[-1] == 2)  # the ticker ran beside the loop
    assert not ended
    stop.set()
    got = await asyncio.wait_for(task, LIMIT_S)
    assert got is stats and ended == [True]
    assert (stats.consumed, stats.published) == (2, 2)


async def test_main_ends_the_service_and_sets_ready_itself(bus: BusSettings) -> None:
    """With a main, `ready` is the main's to set (after its own start-up), and the
    service ends when the main returns, the consumer loop stopped with it."""
    t = bus.topics
    handled: list[bytes] = []
    seen: dict[str, bool] = {}

    def handle(rec: Record) -> list[Outgoing]:
        handled.append(rec.value or b"")
        return []

    async def main(s: Serving) -> None:
        await s.until_built()
        seen["ready_before_main_set_it"] = s.ready.is_set()
        s.ready.set()
        await _send(s.settings, t.jobs_submit, [b"x"])
        await _until(lambda: handled == [b"x"])
        seen["stop_while_main_ran"] = s.stop.is_set()

    spec = ServiceSpec(name="serving-main-test", topics=[t.jobs_submit], handle=handle)
    stop, ready = asyncio.Event(), asyncio.Event()
    stats = await asyncio.wait_for(serve(bus, spec, stop, ready, main=main), LIMIT_S)
    assert seen == {"ready_before_main_set_it": False, "stop_while_main_ran": False}
    assert ready.is_set() and stop.is_set() and stats.consumed == 1


async def test_a_spec_built_afresh_takes_the_caller_group(bus: BusSettings) -> None:
    """A service whose spec is built per takeover gets the caller's consumer group,
    as one built once does."""
    t = bus.topics
    built: list[ServiceSpec] = []

    def build(settings: BusSettings, stats: ServiceStats) -> ServiceSpec:
        spec = ServiceSpec(name="serving-build-test", topics=[t.jobs_submit], handle=lambda r: [])
        built.append(spec)
        return spec

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(bus, build, stop, ready, group_id=f"{t.prefix}mine"))
    await asyncio.wait_for(ready.wait(), LIMIT_S)
    stop.set()
    await asyncio.wait_for(task, LIMIT_S)
    assert built and all(s.group_id == f"{t.prefix}mine" for s in built)
