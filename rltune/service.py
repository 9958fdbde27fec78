"""`rltune service NAME`: run one service (what compose and k8s run)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import logging
import os
from collections.abc import Awaitable, Callable
from types import ModuleType

from rltune.common import add_bus_args, bus_settings, port_or_off, positive_float, run_async
from shared.broker import wait_for_broker
from shared.bus import stop_on_signals
from shared.config import BusSettings
from shared.errors import UserError
from shared.prom import serve_http, track

# service name -> module with `async def serve(settings, stop=None, ready=None)`
SERVICES = {
    "arrival": "services.arrival.service",
    "scoring": "services.scoring.service",
    "placement": "services.placement.service",
    "telemetry": "services.telemetry.service",
    "ledger": "services.ledger.service",
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
    p = sub.add_parser(
        "service", help="run one service", description="One service; NAME --help: its flags."
    )
    p.add_argument("name", metavar="NAME", choices=list(SERVICES), help=", ".join(SERVICES))
    p.add_argument("flags", nargs=argparse.REMAINDER, help="the service's flags")
    p.set_defaults(func=run)


def service_parser(name: str, module: ModuleType) -> argparse.ArgumentParser:
    """The flags of one service: the common ones, then its own (`add_args`). Built
    only for the service asked for, so no command imports every service."""
    from rltune import _Parser

    p = _Parser(prog=f"rltune service {name}", description=(module.__doc__ or "").split("\n")[0])
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
    if hasattr(module, "add_args"):
        module.add_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    try:  # only the service asked for is imported (the host agent's imports torch)
        module = importlib.import_module(SERVICES[args.name])
    except ModuleNotFoundError as exc:
        if exc.name is not None and SERVICES[args.name].startswith(exc.name):
            raise UserError(f"service {args.name!r} is not built into this checkout") from None
        raise
    opts = service_parser(args.name, module).parse_args(args.flags)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = bus_settings(opts)
    kwargs: dict[str, object] = {"group_id": opts.group_id} if opts.group_id else {}
    if hasattr(module, "from_args"):
        kwargs["conf"] = module.from_args(opts)
    address = opts.prometheus_address or os.environ.get("RLTUNE_PROMETHEUS_ADDRESS") or "127.0.0.1"
    serve_http(opts.prometheus_port, address)
    track(args.name)
    # everything imported so far lives as long as the process: out of the collector's
    # reach, so that a full collection (a pause in every round) stays short
    gc.collect()
    gc.freeze()
    run_async(_serve(module.serve, settings, kwargs, opts.connect_timeout))
    return 0


async def _serve(
    serve: Callable[..., Awaitable[object]],
    settings: BusSettings,
    kwargs: dict[str, object],
    connect_timeout_s: float,
) -> None:
    # as the service itself logs in (else one line, exit 2)
    await wait_for_broker(settings.bootstrap, connect_timeout_s, settings.security)
    stop = asyncio.Event()
    stop_on_signals(stop)  # SIGTERM (compose, k8s) and Ctrl-C stop it cleanly
    await serve(settings, stop=stop, **kwargs)
