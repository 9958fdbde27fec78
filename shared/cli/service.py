"""`rltune service NAME`: run one service (what compose and k8s run)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
from collections.abc import Awaitable, Callable

from shared.broker import wait_for_broker
from shared.bus import stop_on_signals
from shared.cli.common import add_bus_args, bus_settings, port_or_off, positive_float, run_async
from shared.config import BusSettings
from shared.errors import UserError
from shared.prom import serve_http, track

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
        type=port_or_off,
        default=0,
        help="serve /metrics, /healthz (liveness) and /readyz (readiness) on this port "
        "(default: off)",
    )
    p.add_argument(
        "--prometheus-address",
        default=None,
        help="address to serve them on (default: $RLTUNE_PROMETHEUS_ADDRESS or 127.0.0.1; "
        "0.0.0.0 for every interface, as in a container)",
    )
    p.add_argument(
        "--group-id",
        default=None,
        help="consumer group (default: <topic prefix><service name>)",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=60.0,
        help="seconds to wait for the broker at start-up before giving up (default 60); "
        "once running, a service outlives any broker outage",
    )
    add_bus_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name not in available():
        raise UserError(f"no service {args.name!r}; available: {', '.join(available())}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = bus_settings(args)
    module = importlib.import_module(SERVICES[args.name])
    address = args.prometheus_address or os.environ.get("RLTUNE_PROMETHEUS_ADDRESS") or "127.0.0.1"
    serve_http(args.prometheus_port, address)
    track(args.name)
    run_async(_serve(module.serve, settings, args.group_id, args.connect_timeout))
    return 0


async def _serve(
    serve: Callable[..., Awaitable[object]],
    settings: BusSettings,
    group_id: str | None,
    connect_timeout_s: float,
) -> None:
    await wait_for_broker(settings.bootstrap, connect_timeout_s)  # else one line, exit 2
    stop = asyncio.Event()
    stop_on_signals(stop)  # SIGTERM (compose, k8s) and Ctrl-C stop it cleanly
    kwargs = {"group_id": group_id} if group_id else {}
    await serve(settings, stop=stop, **kwargs)
