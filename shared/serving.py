"""The one entry point of every service: `serve`.

A service adds only its messaging: a `ServiceSpec` (its topics and its handler,
shared/bus.py) and, where it has them, tasks of its own beside the consumer loop
(scoring's free-round ticker, telemetry's snapshot publisher, the host agent's
status) or its own main work (cluster-sim's simulation that drives the rounds).
`serve` starts them with the consumer loop (`shared.bus.run_service`: consume,
handle, publish, commit, the read-back on takeover), sets the caller's `ready`
once the state is rebuilt, and stops them all together when `stop` is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from shared.bus import ServiceSpec, ServiceStats, run_service
from shared.config import BusSettings

__all__ = ["Serving", "serve"]


@dataclass
class Serving:
    """What a service's own tasks beside the consumer loop get from `serve`."""

    settings: BusSettings
    stop: asyncio.Event  # set: the service is stopping (every task should return)
    stats: ServiceStats  # the service's counters (the consumer loop's too)
    built: asyncio.Event  # set once the consumer holds partitions with its state built
    ready: asyncio.Event  # the caller's readiness (`serve` sets it at `built`, but
    # for a service with a `main`, which sets it itself)
    consumer: asyncio.Task[ServiceStats] | None = None  # the loop, under a `main`

    async def until_built(self) -> None:
        """Wait until the consumer is up, or raise what stopped it."""
        if self.consumer is None:
            await self.built.wait()
            return
        waiter = asyncio.ensure_future(self.built.wait())
        await asyncio.wait([waiter, self.consumer], return_when=asyncio.FIRST_COMPLETED)
        if self.consumer.done():
            waiter.cancel()
            self.consumer.result()


async def serve(
    settings: BusSettings,
    spec: ServiceSpec | Callable[[BusSettings, ServiceStats], ServiceSpec],
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
    *,
    stats: ServiceStats | None = None,
    beside: Sequence[Callable[[Serving], Coroutine[Any, Any, None]]] = (),
    main: Callable[[Serving], Awaitable[None]] | None = None,
) -> ServiceStats:
    """Run one service until `stop` is set: the entry point of every service, which
    adds only its messaging. `group_id` overrides the default consumer group
    (`<topic prefix><service name>`); `ready` is set once the service holds
    partitions with its state built.

    * `spec`: a `ServiceSpec` whose handler keeps its state across takeovers
      (replayed at the first assignment only), or a function that builds the spec
      afresh (new handler state, read back) whenever the service takes partitions.
    * `beside`: tasks that run as long as the service does (a ticker, a publisher
      of snapshots); each is awaited after `stop` is set.
    * `main`: the service's own work (a simulation that drives the bus), run once
      the consumer loop is started; the service ends when it returns (then `stop` is
      set), and it sets `Serving.ready` itself."""
    stop = stop or asyncio.Event()
    stats = stats or ServiceStats()
    built = asyncio.Event()
    serving = Serving(settings, stop, stats, built, ready or asyncio.Event())
    if isinstance(spec, ServiceSpec):
        if group_id:
            spec.group_id = group_id
        consumer = run_service(settings, spec, stop, stats, built)
    else:
        build = spec

        def fresh(settings: BusSettings, stats: ServiceStats) -> ServiceSpec:
            made = build(settings, stats)
            if group_id:
                made.group_id = group_id
            return made

        consumer = run_service(settings, fresh(settings, stats), stop, stats, built, fresh)
    tasks = [asyncio.create_task(b(serving)) for b in beside]
    relay = asyncio.create_task(_relay(built, serving.ready)) if main is None else None
    try:
        if main is None:
            return await consumer
        serving.consumer = asyncio.create_task(consumer)
        await main(serving)
        stop.set()
        return await serving.consumer
    finally:
        stop.set()
        if relay is not None:
            relay.cancel()
        if serving.consumer is not None and not serving.consumer.done():
            await asyncio.wait([serving.consumer])  # it closes its clients on `stop`
        for task in tasks:
            await task


async def _relay(built: asyncio.Event, ready: asyncio.Event) -> None:
    """The caller's `ready` once the state is built."""
    await built.wait()
    ready.set()
