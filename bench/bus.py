"""`rltune bench bus`: jobs/s through the arrival service next to raw aiokafka, same broker.

Both runs move the same N JobSpec messages with the same producer and consumer
code in this process; they differ only in the hop between them:

  raw      produce → topic → consume
  relay    produce → topic → plain aiokafka relay (own process) → topic → consume
  arrival  produce → jobs.submit → arrival service (own process, as deployed)
           → jobs.accepted → consume

Each rate is N / (first send → last message read); runs alternate raw, relay,
arrival, ... and the median of each is reported with its ratio to raw. The
relay is the same two-hop path with nothing done in the middle: arrival /
relay is what validation, dead-lettering and the exactly-once bookkeeping
cost; arrival / raw also pays for the second hop through the broker.

Then (`--latency-rates`) submit → placement latency through arrival, scoring
and placement (each its own process, free rounds as on live hosts, the MILP
placer) at sustained arrival rates, with the time spent in each stage
(bench/_latency.py); a rate is held when every job is placed and the last
within a second of the last submission.
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
from typing import Any, cast

from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.table import Table

from bench._latency import STAGES, measure_rates
from shared.broker import EmbeddedBroker, ensure_topics
from shared.bus import Producer, partitions_of
from shared.config import BusSettings
from shared.jsonfile import write_json

__all__ = ["main"]


def _payloads(n: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        job_id = f"bench-{i}"
        spec = {"job_id": job_id, "num_gpus": 1 << (i % 4), "user": f"u{i % 37}", "vc": "nlp"}
        out.append((job_id, json.dumps(spec).encode()))
    return out


async def _pipe(
    settings: BusSettings, src: str, dst: str, payloads: list[tuple[str, bytes]]
) -> float:
    """Seconds from the first send to `src` until len(payloads) messages were read from `dst`."""
    c = AIOKafkaConsumer(**settings.client_kwargs(), enable_auto_commit=False)
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
def _process(cmd: list[str], settings: BusSettings) -> Iterator[None]:
    env = dict(
        os.environ,
        RLTUNE_BOOTSTRAP_SERVERS=settings.bootstrap,
        RLTUNE_TOPIC_PREFIX=settings.topic_prefix,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _warm(settings: BusSettings, src: str, dst: str) -> None:
    """Until the process in the middle answers (it has joined its group)."""
    for i in range(600):
        try:
            await asyncio.wait_for(_pipe(settings, src, dst, [(f"warm-{i}", _warm_spec(i))]), 5)
            return
        except TimeoutError:
            continue
    raise RuntimeError("the process under test did not answer within 60 s")


def _warm_spec(i: int) -> bytes:
    return json.dumps({"job_id": f"warm-{i}", "num_gpus": 1}).encode()


def _hop(bootstrap: str, prefix: str, payloads: list[tuple[str, bytes]], kind: str) -> float:
    """msgs/s of one run of the path `kind` (raw, relay or arrival) under fresh topics."""
    s = BusSettings(bootstrap, prefix)
    t = s.topics
    if kind == "raw":
        asyncio.run(ensure_topics(s, [t.name("pipe")]))
        return len(payloads) / asyncio.run(_pipe(s, t.name("pipe"), t.name("pipe"), payloads))
    asyncio.run(ensure_topics(s))
    if kind == "relay":
        cmd = ["bench._relay", bootstrap, t.jobs_submit, t.jobs_accepted]
    else:
        cmd = ["rltune", "service", "arrival"]
    with _process(cmd, s):
        asyncio.run(_warm(s, t.jobs_submit, t.jobs_accepted))
        return len(payloads) / asyncio.run(_pipe(s, t.jobs_submit, t.jobs_accepted, payloads))


PATHS = ("raw", "relay", "arrival")


def _measure(bootstrap: str, n: int, rounds: int, console: Console) -> dict[str, object]:
    rates: dict[str, list[float]] = {k: [] for k in PATHS}
    payloads = _payloads(n)
    for r in range(rounds):
        for kind in PATHS:
            rates[kind].append(_hop(bootstrap, f"bench{kind}{r}.", payloads, kind))
        console.print(
            f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {rates[k][-1]:,.0f}/s" for k in PATHS),
            highlight=False,
        )
    # Ratios are taken from the rounded rates that are printed, so a reader who
    # divides the reported figures gets exactly the reported ratio.
    med = {k: round(statistics.median(v)) for k, v in rates.items()}
    return {
        "messages": n,
        "rounds": rounds,
        "raw_msgs_per_s": med["raw"],
        "relay_msgs_per_s": med["relay"],
        "arrival_jobs_per_s": med["arrival"],
        "ratio": round(med["arrival"] / med["raw"], 3),
        "ratio_vs_relay": round(med["arrival"] / med["relay"], 3),
        "runs": {k: [round(x) for x in v] for k, v in rates.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rltune bench bus", description=__doc__)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bootstrap", default=None, help="use this broker instead of an embedded one")
    ap.add_argument("--json", default=None, help="write the figures as JSON ('-' = stdout)")
    ap.add_argument(
        "--latency-rates",
        default="100,500,2000",
        help="jobs/s for the submit → placement latency runs ('' = none)",
    )
    ap.add_argument("--latency-seconds", type=float, default=10.0, help="length of each run")
    args = ap.parse_args(argv)
    rates = [float(r) for r in args.latency_rates.split(",") if r.strip()]
    console = Console(stderr=True)
    if args.bootstrap:
        result = _measure(args.bootstrap, args.messages, args.rounds, console)
        result["latency"] = _latency(args.bootstrap, rates, args.latency_seconds, console)
    else:
        with EmbeddedBroker() as broker:
            result = _measure(broker.bootstrap, args.messages, args.rounds, console)
            result["latency"] = _latency(broker.bootstrap, rates, args.latency_seconds, console)
    _report(result, args.json)
    return 0


@contextmanager
def _scheduler(settings: BusSettings) -> Iterator[None]:
    """Arrival, scoring (free rounds) and placement, each its own process."""
    with (
        _process(["rltune", "service", "arrival"], settings),
        _process(["rltune", "service", "scoring", "--rounds", "free"], settings),
        _process(["rltune", "service", "placement", "--placer", "milp"], settings),
    ):
        yield


def _latency(
    bootstrap: str, rates: list[float], seconds: float, console: Console
) -> list[dict[str, object]]:
    def log(line: str) -> None:
        console.print(line, highlight=False)

    return measure_rates(bootstrap, rates, seconds, _scheduler, log)


def _report(result: dict[str, object], json_out: str | None) -> None:
    t = Table(title=f"bus throughput, median of {result['rounds']} rounds")
    for col in ("path", "msgs/s", "vs raw"):
        t.add_column(col)
    raw = float(result["raw_msgs_per_s"])  # type: ignore[arg-type]
    rows = (
        ("raw: produce→consume", "raw_msgs_per_s"),
        ("relay: produce→plain relay→consume", "relay_msgs_per_s"),
        ("arrival: submit→arrival→accepted", "arrival_jobs_per_s"),
    )
    for label, key in rows:
        v = float(result[key])  # type: ignore[arg-type]
        t.add_row(label, f"{v:,.0f}", f"{v / raw:.3f}")
    out = Console(stderr=json_out == "-")
    out.print(t)
    latency = cast(list[dict[str, Any]], result.get("latency") or [])
    if latency:
        lat = Table(title="submit → placement latency (ms), sustained arrival rate")
        for col in ("jobs/s", "placed", "held", *(f"{s} p50/p99" for s in STAGES)):
            lat.add_column(col)
        for row in latency:
            lat.add_row(
                f"{row['rate']:g}",
                f"{row['placed']}/{row['jobs']}",
                "yes" if row["held"] else "no",
                *(f"{row[f'{s} p50 ms']} / {row[f'{s} p99 ms']}" for s in STAGES),
            )
        out.print(lat)
    if json_out:
        write_json(result, json_out)
