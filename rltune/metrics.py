"""`rltune metrics [--follow]`: read the metrics stream.

Without `--follow`: everything on the topic so far, the latest snapshot of each
source as a table, then exit. With it, on a terminal: the operator's view of the
latest snapshots (the one `rltune up` shows), refreshed as they arrive; piped or
redirected (or with `--json`): one JSON line per snapshot as it arrives, for a
program to read. `--json` without `--follow` prints the snapshots so far as JSON
lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.live import Live
from rich.table import Table

from rltune.common import add_bus_args, bus_settings, run_async, unreachable
from shared.bus import partitions_of, read_to_end
from shared.config import BusSettings
from shared.health import BROKER, quiet_aiokafka
from shared.messages import MetricsSnapshot

_DEC = msgspec.json.Decoder(MetricsSnapshot)
_SUMMARY_KEYS = (
    "jobs",
    "avg_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "avg_bsld",
    "gpu_util",
    "placement_p99_ms",
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("metrics", help="read the metrics stream")
    p.add_argument("--follow", action="store_true", help="keep reading new snapshots")
    p.add_argument("--json", action="store_true", help="print snapshots as JSON lines")
    add_bus_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = bus_settings(args)
    run_async(_read(settings, args.follow, args.json))
    return 0


def describe(snap: MetricsSnapshot) -> str:
    """One line for a snapshot: the scheduling figures if any, then the counters."""
    parts = [f"{snap.source or snap.window}"]
    if snap.jobs:
        parts += [f"{k}={getattr(snap, k):.4g}" for k in _SUMMARY_KEYS]
    parts += [f"{k}={v:g}" for k, v in sorted(snap.counters.items())]
    if snap.rejected:
        parts.append("rejected{" + ",".join(f"{k}={v}" for k, v in snap.rejected.items()) + "}")
    return " ".join(parts)


def table(latest: dict[str, MetricsSnapshot]) -> Table:
    t = Table(title="rltune metrics (latest per source)")
    t.add_column("source")
    t.add_column("figures")
    for source, snap in sorted(latest.items()):
        t.add_row(source, describe(snap).split(" ", 1)[-1])
    return t


async def _read(settings: BusSettings, follow: bool, as_json: bool) -> None:
    console = Console()
    c = AIOKafkaConsumer(**settings.client_kwargs(), enable_auto_commit=False)
    try:
        await c.start()
    except (KafkaError, OSError) as exc:
        with contextlib.suppress(Exception):
            await c.stop()
        raise unreachable(settings, exc) from None
    try:
        parts = await partitions_of(c, [settings.topics.metrics])
        if not parts:
            console.print(f"no topic {settings.topics.metrics} yet (is anything running?)")
            return
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        latest: dict[str, MetricsSnapshot] = {}
        if not follow:
            async for msgs in read_to_end(c, parts):
                for m in msgs:
                    _show(m.value, latest, console, follow, as_json)
            if not as_json:
                console.print(table(latest))
            return
        quiet_aiokafka(announce=True)
        screen = console.is_terminal and not as_json
        live = Live(_view(latest), console=console, refresh_per_second=2) if screen else None
        with live if live is not None else contextlib.nullcontext():
            while True:  # through outages: aiokafka reconnects; one line says so (shared.health)
                batch = await c.getmany(timeout_ms=500)
                if batch:
                    BROKER.ok()
                for msgs in batch.values():
                    for m in msgs:
                        _show(m.value, latest, console, False, not screen)  # (screen: kept)
                if live is not None and batch:
                    live.update(_view(latest))
    except asyncio.CancelledError:
        pass
    finally:
        await c.stop()


def _view(latest: dict[str, MetricsSnapshot]) -> Any:
    from rltune.up import view

    now = time.strftime("%H:%M:%S")
    return view(latest, 0.0, f"rltune metrics --follow: {len(latest)} sources, updated {now}")


def _show(
    value: bytes | None,
    latest: dict[str, MetricsSnapshot],
    console: Console,
    follow: bool,
    as_json: bool,
) -> None:
    try:
        snap = _DEC.decode(value or b"")
    except msgspec.MsgspecError:
        return
    latest[snap.source or snap.window] = snap
    if as_json:
        print(msgspec.json.encode(snap).decode(), flush=True)
    elif follow:
        console.print(describe(snap), highlight=False)
