"""Submit → placement latency through the deployed services (`rltune bench bus`).

Arrival, scoring (free rounds, as on live hosts) and placement run as their own
processes on one broker; the bench publishes `NodeStatus` for a large simulated
inventory (so that every job fits), then submits 1-GPU jobs at a sustained rate
for a few seconds. Every stage is timed from the records' own timestamps on the
bus (one clock: this machine's): submit (the bench's send), accepted (arrival's
output), first scored (the first `PriorityBatch` naming the job) and placed (the
`PlacementBatch` assigning it). A rate is held when every job was placed and the
last one within a second of the last submission.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import msgspec

from shared.bus import Producer, Record, read_back
from shared.config import BusSettings
from shared.messages import NodeStatus, PlacementBatch, PriorityBatch, encode
from shared.metrics import percentile

__all__ = ["STAGES", "measure_rates"]

STAGES = ("submit→accepted", "accepted→scored", "scored→placed", "submit→placed")
NODES, GPUS = 2560, 8  # 20,480 GPUs: room for every job of the fastest run (and the warm-up)


async def _inventory(settings: BusSettings) -> None:
    async with Producer(settings) as p:
        for i in range(NODES):
            st = NodeStatus(f"n{i}", "V100", GPUS, list(range(GPUS)), source="inventory")
            await p.send(settings.topics.cluster_nodes, st.node_id, encode(st))
        await p.flush()


async def _submit(settings: BusSettings, tag: str, rate: float, seconds: float) -> dict[str, float]:
    """Jobs at `rate` per second for `seconds`; their send times (epoch s)."""
    sent: dict[str, float] = {}
    n = int(rate * seconds)
    async with Producer(settings) as p:
        t0 = time.monotonic()
        for i in range(n):
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0.002:
                await asyncio.sleep(delay)
            jid = f"{tag}-{i}"
            sent[jid] = time.time()
            body = b'{"job_id":"%s","num_gpus":1,"command":["true"]}' % jid.encode()
            await p.send(settings.topics.jobs_submit, jid, body)
        await p.flush()
    return sent


async def _stages(settings: BusSettings, sent: dict[str, float]) -> dict[str, list[float]]:
    t = settings.topics
    accepted: dict[str, float] = {}
    scored: dict[str, float] = {}
    placed: dict[str, float] = {}
    prio = msgspec.json.Decoder(PriorityBatch)
    place = msgspec.json.Decoder(PlacementBatch)

    def keep(rec: Record) -> None:
        ts = rec.timestamp_ms / 1000.0
        if rec.topic == t.jobs_accepted and rec.key:
            accepted.setdefault(rec.key.decode(), ts)
        elif rec.topic == t.sched_priorities:
            for jid, _ in prio.decode(rec.value or b"").jobs:
                scored.setdefault(jid, ts)
        elif rec.topic == t.sched_placements:
            for a in place.decode(rec.value or b"").assignments:
                placed.setdefault(a.job_id, ts)

    await read_back(settings, [t.jobs_accepted, t.sched_priorities, t.sched_placements], keep)
    out: dict[str, list[float]] = {s: [] for s in STAGES}
    for jid, s in sent.items():
        if jid not in placed:
            continue
        a, c, p = accepted.get(jid, s), scored.get(jid, s), placed[jid]
        out["submit→accepted"].append(max(a - s, 0.0) * 1e3)
        out["accepted→scored"].append(max(c - a, 0.0) * 1e3)
        out["scored→placed"].append(max(p - c, 0.0) * 1e3)
        out["submit→placed"].append(max(p - s, 0.0) * 1e3)
    out["_placed_at"] = [max(placed.values(), default=0.0)]
    return out


def measure_rates(
    bootstrap: str,
    rates: list[float],
    seconds: float,
    services: Callable[[BusSettings], AbstractContextManager[None]],
    log: Callable[[str], None],
) -> list[dict[str, object]]:
    """One run per rate, each on fresh topics with freshly started services."""
    from shared.broker import ensure_topics

    rows = []
    for rate in rates:
        settings = BusSettings(bootstrap, f"lat{int(rate)}x{int(time.time()) % 100000}.")
        asyncio.run(ensure_topics(settings))
        asyncio.run(_inventory(settings))
        with services(settings):
            warm = asyncio.run(_submit(settings, "warm", 10.0, 0.1))
            for _ in range(120):  # every service has joined and read the inventory
                time.sleep(1.0)
                if asyncio.run(_stages(settings, warm))["submit→placed"]:
                    break
            sent = asyncio.run(_submit(settings, "j", rate, seconds))
            last_sent = max(sent.values())
            deadline = time.time() + 10.0 + seconds
            stages: dict[str, list[float]] = {}
            while time.time() < deadline:
                time.sleep(1.0)
                stages = asyncio.run(_stages(settings, sent))
                if len(stages["submit→placed"]) == len(sent):
                    break
        done = len(stages.get("submit→placed", []))
        held = done == len(sent) and stages["_placed_at"][0] - last_sent <= 1.0
        row: dict[str, object] = {"rate": rate, "jobs": len(sent), "placed": done, "held": held}
        for s in STAGES:
            vals = stages.get(s, [])
            row[f"{s} p50 ms"] = round(percentile(vals, 50), 1) if vals else None
            row[f"{s} p99 ms"] = round(percentile(vals, 99), 1) if vals else None
        log(
            f"{rate:g} jobs/s: {done}/{len(sent)} placed, submit→placed p99 "
            f"{row['submit→placed p99 ms']} ms, held: {held}"
        )
        rows.append(row)
    return rows
