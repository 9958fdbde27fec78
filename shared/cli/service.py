"""`rltune service NAME`: run one service (what compose and k8s run)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
from collections.abc import Awaitable, Callable

from shared.bus import stop_on_signals
from shared.cli.common import add_bus_args, bus_settings, run_async
from shared.config import BusSettings
from shared.errors import UserError
from shared.prom import UP, serve_prometheus

# service name -> module with `async def serve(settings, stop=None, ready=None)`
SERVICES = {
    "arrival": "services.arrival.service",
    "scoring": "services.scoring.service",
    "placement": "services.placement.service",
    "telemetry": "services.telemetry.service",
    "profiler": "services.profiler.service",
    "cluster-sim": "services.cluster_sim.service",
    "offload-agent": "offload_agent.agent",
}


def available() -> list[str]:
    out = []
    for name, module in SERVICES.items():
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module.startswith(exc.name):
                continue
            raise
        out.append(name)
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="run one service")
    p.add_argument("name", help="service: " + ", ".join(SERVICES))
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=0,
        help="serve Prometheus /metrics on this port (default: off)",
    )
    p.add_argument(
        "--group-id",
        default=None,
        help="consumer group (default: <topic prefix><service name>)",
    )
    add_bus_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name not in available():
        raise UserError(f"no service {args.name!r}; available: {', '.join(available())}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = bus_settings(args)
    module = importlib.import_module(SERVICES[args.name])
    serve_prometheus(args.prometheus_port)
    UP.labels(args.name).set(1)
    run_async(_serve(module.serve, settings, args.group_id))
    return 0


async def _serve(
    serve: Callable[..., Awaitable[object]], settings: BusSettings, group_id: str | None
) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)  # SIGTERM (compose, k8s) and Ctrl-C stop it cleanly
    kwargs = {"group_id": group_id} if group_id else {}
    await serve(settings, stop=stop, **kwargs)
