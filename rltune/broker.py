"""`rltune broker [--port 9092]`: the embedded broker alone, with the topics created."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from rltune.common import port_number, positive_int, run_async
from shared.broker import EmbeddedBroker, ensure_topics
from shared.config import BusSettings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (Tansu)")
    p.add_argument(
        "--port", type=port_number, default=9092, help="port on 127.0.0.1 (default 9092)"
    )
    p.add_argument("--topic-prefix", default=None, help="prefix of the topics to create")
    p.add_argument(
        "--partitions", type=positive_int, default=1, help="partitions per topic (default 1)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    broker = EmbeddedBroker(args.port)
    with broker:
        settings = BusSettings.resolve(broker.bootstrap, args.topic_prefix)
        run_async(ensure_topics(settings, partitions=args.partitions))
        print(f"broker ready on {broker.bootstrap} (topics under {settings.topic_prefix!r})")
        print("Ctrl-C stops it.", file=sys.stderr)
        stopped = run_async(_until_signal(broker))
        if not stopped:
            code = broker.wait()
            print(f"rltune broker: the broker process exited (status {code})", file=sys.stderr)
            return 1
    return 0


async def _until_signal(broker: EmbeddedBroker) -> bool:
    """Until SIGINT / SIGTERM (True) or the broker process exits by itself (False)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and broker.running:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)
    return stop.is_set()
