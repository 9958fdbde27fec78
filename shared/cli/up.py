"""`rltune up`: the embedded broker, every service, a trace replay, live metrics.

Everything runs in this one process on one event loop except the broker (a
child process tied to this one). Ctrl-C stops the replay, then every service
(each commits what it has done), then the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from shared.broker import EmbeddedBroker, ensure_topics, free_port
from shared.bus import Producer, partitions_of
from shared.cli.common import port_number, positive_int, run_async, write_json
from shared.cli.metrics import describe
from shared.cli.service import SERVICES, available
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import MetricsSnapshot, encode
from shared.replay import Paced, job_spec_of, paced
from shared.traces import SkipStats
from shared.traces.registry import open_trace

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "philly-2000.jsonl"
# the services `up` starts, in start order, when their module exists
UP_SERVICES = ("arrival", "telemetry", "scoring", "placement", "profiler", "cluster-sim")
# flags of DESIGN.md that need the simulated cluster in the loop (cluster-sim service)
_NEEDS_CLUSTER_SIM = ("lockstep", "jobs_out", "cluster", "policy")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="embedded broker + every service + trace replay, live metrics")
    p.add_argument("--trace", type=Path, default=SAMPLE, help=f"trace file (default {SAMPLE.name})")
    p.add_argument("--format", default="jsonl", help="trace format (default jsonl)")
    p.add_argument("--limit", type=positive_int, default=None, help="replay only the first N jobs")
    p.add_argument("--cluster", default=None, help="cluster spec (needs cluster-sim)")
    p.add_argument("--policy", default=None, help="scheduling policy (needs scoring)")
    p.add_argument("--speedup", type=float, default=1000.0, help="trace time / wall time")
    p.add_argument("--lockstep", action="store_true", help="virtual-time rounds (cluster-sim)")
    p.add_argument("--until-done", action="store_true", help="exit when the trace is done")
    p.add_argument("--json", default=None, help="write final figures as JSON ('-' = stdout)")
    p.add_argument("--jobs-out", default=None, help="per-job CSV (needs cluster-sim)")
    p.add_argument(
        "--port", type=port_number, default=None, help="broker port (default: 9092 if free)"
    )
    p.add_argument("--topic-prefix", default=None, help="topic name prefix")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    stats = SkipStats()
    schedule = list(
        paced(open_trace(args.trace, args.format, None, stats), args.speedup, args.limit)
    )
    if not schedule:
        raise UserError(f"{args.trace}: no jobs to replay ({stats.total} rows skipped)")
    port = args.port if args.port is not None else _default_port()
    console = Console()
    with EmbeddedBroker(port) as broker:
        settings = BusSettings.resolve(broker.bootstrap, args.topic_prefix)
        run_async(ensure_topics(settings))
        console.print(
            f"broker on {broker.bootstrap}; replaying {len(schedule)} jobs from {args.trace} "
            f"at {args.speedup:g}x ({stats.total} rows skipped); Ctrl-C stops",
            highlight=False,
        )
        final = run_async(_up(settings, schedule, args.until_done, console))
    if args.json is not None:
        write_json(final, args.json, sort_keys=True)
    return 0


def _check_args(args: argparse.Namespace) -> None:
    if args.speedup <= 0:
        raise UserError("--speedup must be positive")
    if "cluster-sim" not in available():
        given = [f"--{k.replace('_', '-')}" for k in _NEEDS_CLUSTER_SIM if getattr(args, k)]
        if given:
            raise UserError(
                f"{', '.join(given)} need(s) the simulated cluster (service cluster-sim), "
                "which this version does not have yet"
            )


def _default_port() -> int:
    import socket

    with socket.socket() as s:
        return 9092 if s.connect_ex(("127.0.0.1", 9092)) != 0 else free_port()


@dataclass
class _Progress:
    total: int
    submitted: int = 0
    started: float = field(default_factory=time.monotonic)
    latest: dict[str, MetricsSnapshot] = field(default_factory=dict)
    done_replay: bool = False

    def answered(self) -> int:
        arrival = self.latest.get("arrival")
        if arrival is None:
            return 0
        return int(arrival.counters.get("accepted", 0) + arrival.counters.get("rejected_total", 0))


async def _up(
    settings: BusSettings, schedule: list[Paced], until_done: bool, console: Console
) -> dict[str, Any]:
    stop = asyncio.Event()
    progress = _Progress(total=len(schedule))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    services = [
        asyncio.create_task(_serve(name, settings, stop), name=name)
        for name in UP_SERVICES
        if name in available()
    ]
    watchers = [
        asyncio.create_task(_replay(settings, schedule, progress, stop)),
        asyncio.create_task(_follow_metrics(settings, progress, stop)),
    ]
    await _display(progress, stop, until_done, console, services)
    stop.set()
    await asyncio.gather(*watchers, return_exceptions=True)
    await asyncio.gather(*services, return_exceptions=True)
    return _final(progress)


async def _serve(name: str, settings: BusSettings, stop: asyncio.Event) -> None:
    module = importlib.import_module(SERVICES[name])
    serve: Callable[..., Awaitable[object]] = module.serve
    await serve(settings, stop=stop)


async def _replay(
    settings: BusSettings, schedule: list[Paced], progress: _Progress, stop: asyncio.Event
) -> None:
    topic = settings.topics.jobs_submit
    async with Producer(settings, client_id="rltune-replay") as producer:
        t0 = time.monotonic()
        for item in schedule:
            delay = t0 + item.at_s - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
            if stop.is_set():
                break
            spec = job_spec_of(item.job)
            await producer.send(topic, spec.job_id, encode(spec))
            progress.submitted += 1
        await producer.flush()
    progress.done_replay = True


async def _follow_metrics(settings: BusSettings, progress: _Progress, stop: asyncio.Event) -> None:
    dec = msgspec.json.Decoder(MetricsSnapshot)
    c = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, enable_auto_commit=False)
    await c.start()
    try:
        parts = await partitions_of(c, [settings.topics.metrics])
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        while not stop.is_set():
            for msgs in (await c.getmany(timeout_ms=300)).values():
                for m in msgs:
                    with contextlib.suppress(msgspec.MsgspecError):
                        snap = dec.decode(m.value or b"")
                        progress.latest[snap.source or snap.window] = snap
    finally:
        await c.stop()


def _view(progress: _Progress) -> Group:
    elapsed = time.monotonic() - progress.started
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"replay {progress.submitted}/{progress.total} submitted",
        f"{progress.answered()} answered",
        f"{elapsed:.0f} s",
    )
    t = Table(title="metrics (latest per source)", expand=True)
    t.add_column("source", no_wrap=True)
    t.add_column("figures")
    for source, snap in sorted(progress.latest.items()):
        t.add_row(source, describe(snap).split(" ", 1)[-1])
    return Group(head, t)


async def _display(
    progress: _Progress,
    stop: asyncio.Event,
    until_done: bool,
    console: Console,
    services: list[asyncio.Task[None]],
) -> None:
    def finished() -> bool:
        if stop.is_set() or any(s.done() for s in services):
            return True
        return until_done and progress.done_replay and progress.answered() >= progress.submitted

    if console.is_terminal:
        with Live(_view(progress), console=console, refresh_per_second=4) as live:
            while not finished():
                await asyncio.sleep(0.25)
                live.update(_view(progress))
    else:  # a log, not a screen: one line every few seconds
        last = 0.0
        while not finished():
            await asyncio.sleep(0.25)
            if time.monotonic() - last >= 5:
                last = time.monotonic()
                console.print(
                    f"submitted {progress.submitted}/{progress.total}, "
                    f"answered {progress.answered()}",
                    highlight=False,
                )
        console.print(_view(progress))
    for s in services:
        if s.done() and s.exception() is not None:
            raise UserError(f"service {s.get_name()} stopped: {s.exception()}")


def _final(progress: _Progress) -> dict[str, Any]:
    return {
        "submitted": progress.submitted,
        "answered": progress.answered(),
        "sources": {k: msgspec.to_builtins(v) for k, v in sorted(progress.latest.items())},
    }
