"""`rltune bench bus`: jobs/s through the arrival service next to raw aiokafka, same broker.

Both runs move the same N JobSpec messages with the same producer and consumer
code in this process; they differ only in the hop between them:

  raw      produce → topic → consume
  arrival  produce → jobs.submit → arrival service (own process, as deployed)
           → jobs.accepted → consume

Each rate is N / (first send → last message read); runs alternate raw,
arrival, raw, ... and the median of each is reported with their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.table import Table

from shared.broker import EmbeddedBroker, ensure_topics
from shared.bus import Producer, partitions_of
from shared.config import BusSettings

__all__ = ["main"]


def _payloads(n: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        spec = {"job_id": f"bench-{i}", "num_gpus": 1 << (i % 4), "user": f"u{i % 37}", "vc": "nlp"}
        out.append((spec["job_id"], json.dumps(spec).encode()))  # type: ignore[arg-type]
    return out


async def _pipe(
    settings: BusSettings, src: str, dst: str, payloads: list[tuple[str, bytes]]
) -> float:
    """Seconds from the first send to `src` until len(payloads) messages were read from `dst`."""
    c = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        parts = await partitions_of(c, [dst])
        c.assign(parts)
        await c.seek_to_end(*parts)
        for tp in parts:
            await c.position(tp)
        async with Producer(settings, client_id="bench") as p:
            t0 = time.perf_counter()
            sender = asyncio.create_task(_send_all(p, src, payloads))
            n = 0
            while n < len(payloads):
                for msgs in (await c.getmany(timeout_ms=1000, max_records=10_000)).values():
                    n += len(msgs)
                if time.perf_counter() - t0 > 300:
                    raise RuntimeError(f"only {n} of {len(payloads)} messages arrived in 300 s")
            elapsed = time.perf_counter() - t0
            await sender
        return elapsed
    finally:
        await c.stop()


async def _send_all(p: Producer, topic: str, payloads: list[tuple[str, bytes]]) -> None:
    futs = [await p.send(topic, k, v) for k, v in payloads]
    await asyncio.gather(*futs)


@contextmanager
def _arrival_process(settings: BusSettings) -> Iterator[None]:
    env = dict(
        os.environ,
        RLTUNE_BOOTSTRAP_SERVERS=settings.bootstrap,
        RLTUNE_TOPIC_PREFIX=settings.topic_prefix,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "shared.cli", "service", "arrival"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _warm_arrival(settings: BusSettings) -> None:
    """Until the arrival service answers (it has joined its group)."""
    t = settings.topics
    for i in range(600):
        try:
            await _pipe_timeout(settings, t.jobs_submit, t.jobs_accepted, [(f"warm-{i}", _warm(i))])
            return
        except TimeoutError:
            continue
    raise RuntimeError("the arrival service did not answer within 60 s")


def _warm(i: int) -> bytes:
    return json.dumps({"job_id": f"warm-{i}", "num_gpus": 1}).encode()


async def _pipe_timeout(
    settings: BusSettings, src: str, dst: str, payloads: list[tuple[str, bytes]]
) -> float:
    return await asyncio.wait_for(_pipe(settings, src, dst, payloads), timeout=5)


def _measure(bootstrap: str, n: int, rounds: int, console: Console) -> dict[str, object]:
    raw_rates: list[float] = []
    arr_rates: list[float] = []
    payloads = _payloads(n)
    for r in range(rounds):
        raw = BusSettings(bootstrap, f"benchraw{r}.")
        arr = BusSettings(bootstrap, f"benchalt{r}.")
        asyncio.run(ensure_topics(raw, [raw.topics.name("pipe")]))
        asyncio.run(ensure_topics(arr))
        raw_rates.append(
            n / asyncio.run(_pipe(raw, raw.topics.name("pipe"), raw.topics.name("pipe"), payloads))
        )
        with _arrival_process(arr):
            asyncio.run(_warm_arrival(arr))
            t = arr.topics
            arr_rates.append(n / asyncio.run(_pipe(arr, t.jobs_submit, t.jobs_accepted, payloads)))
        console.print(
            f"round {r + 1}/{rounds}: raw {raw_rates[-1]:,.0f} msg/s, "
            f"arrival {arr_rates[-1]:,.0f} jobs/s",
            highlight=False,
        )
    raw_med, arr_med = statistics.median(raw_rates), statistics.median(arr_rates)
    return {
        "messages": n,
        "rounds": rounds,
        "raw_msgs_per_s": round(raw_med),
        "arrival_jobs_per_s": round(arr_med),
        "ratio": round(arr_med / raw_med, 3),
        "raw_runs": [round(x) for x in raw_rates],
        "arrival_runs": [round(x) for x in arr_rates],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rltune bench bus", description=__doc__)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bootstrap", default=None, help="use this broker instead of an embedded one")
    ap.add_argument("--json", default=None, help="write the figures as JSON ('-' = stdout)")
    args = ap.parse_args(argv)
    console = Console(stderr=True)
    if args.bootstrap:
        result = _measure(args.bootstrap, args.messages, args.rounds, console)
    else:
        with EmbeddedBroker() as broker:
            result = _measure(broker.bootstrap, args.messages, args.rounds, console)
    _report(result, args.json)
    return 0


def _report(result: dict[str, object], json_out: str | None) -> None:
    t = Table(title="bus throughput (median of rounds)")
    for col in ("path", "msgs/s", "vs raw"):
        t.add_column(col)
    t.add_row("raw aiokafka produce→consume", f"{result['raw_msgs_per_s']:,}", "1.000")
    t.add_row(
        "submit→arrival→accepted", f"{result['arrival_jobs_per_s']:,}", f"{result['ratio']:.3f}"
    )
    Console(stderr=json_out == "-").print(t)
    if json_out == "-":
        print(json.dumps(result))
    elif json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=2)
