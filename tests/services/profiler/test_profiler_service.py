"""The profiler service on the real broker: plans for good profiles, dead letters
with a reason for everything else, and it keeps going."""

from __future__ import annotations

import asyncio

import msgspec

from services.profiler import service as profiler
from shared.bus import Producer, Record, read_back
from shared.config import BusSettings
from shared.messages import PrefetchPlan, Rejection, TensorProfile, encode

GOOD = TensorProfile(
    job_id="good-1",
    tensors=[("w", 1 << 20, "float32", "param"), ("b", 64, "float32", "param")],
    order=["w", "b", "w"],
    fast_budget_bytes=8 << 20,
    host_budget_bytes=1 << 20,
)


async def _collect(bus: BusSettings, topic: str, n: int, timeout_s: float = 30) -> list[Record]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        got: list[Record] = []
        await read_back(bus, [topic], got.append)
        if len(got) >= n or asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(0.3)


async def test_plans_and_dead_letters(bus: BusSettings) -> None:
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(profiler.serve(bus, stop, ready))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        no_budget = msgspec.structs.replace(GOOD, job_id="nobudget", fast_budget_bytes=0)
        tiny = msgspec.structs.replace(GOOD, job_id="tiny", fast_budget_bytes=4096)
        async with Producer(bus) as p:
            for key, value in [
                ("junk", b"\xff not json"),
                ("nobudget", encode(no_budget)),
                ("tiny", encode(tiny)),
                ("good-1", encode(GOOD)),
                ("good-1", encode(GOOD)),
            ]:
                await (await p.send(bus.topics.offload_profiles, key, value))
        plans = await _collect(bus, bus.topics.offload_plans, 2)
        dead = await _collect(bus, bus.topics.dead_letter(bus.topics.offload_profiles), 3)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    decoded = [msgspec.json.decode(r.value or b"", type=PrefetchPlan) for r in plans]
    assert [(p.job_id, p.version) for p in decoded] == [("good-1", 1), ("good-1", 2)]
    assert decoded[0].placement == {"w": "gpu", "b": "gpu"}
    reasons = [msgspec.json.decode(r.value or b"", type=Rejection).reason for r in dead]
    assert len(reasons) == 3
    assert any("TensorProfile" in r for r in reasons)
    assert any("fast_budget_bytes" in r for r in reasons)
    assert any("raise the budget" in r for r in reasons)
