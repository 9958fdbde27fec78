"""`quiet_unretrieved_kafka_futures`: a plain future left failed with a Kafka error
is not reported when it is collected; any other exception, and a task, still are."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from aiokafka.errors import NodeNotReadyError

from shared.health import quiet_unretrieved_kafka_futures


def _reports(make: Any) -> list[str]:
    seen: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _lp, ctx: seen.append(str(ctx.get("message"))))
        quiet_unretrieved_kafka_futures()
        quiet_unretrieved_kafka_futures()  # idempotent: one layer
        await make(loop)
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    return seen


async def _future_with(loop: asyncio.AbstractEventLoop, exc: BaseException) -> None:
    fut = loop.create_future()
    fut.set_exception(exc)
    del fut


async def _failed_task(loop: asyncio.AbstractEventLoop) -> None:
    async def boom() -> None:
        raise NodeNotReadyError("node 1")

    task = loop.create_task(boom())
    await asyncio.sleep(0)
    del task


def test_a_kafka_error_on_a_plain_future_is_dropped() -> None:
    assert _reports(lambda lp: _future_with(lp, NodeNotReadyError("node 1"))) == []


def test_other_reports_pass_to_the_handler_before() -> None:
    assert len(_reports(lambda lp: _future_with(lp, ValueError("x")))) == 1
    assert len(_reports(_failed_task)) == 1
