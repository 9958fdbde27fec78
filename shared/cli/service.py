"""`rltune service NAME`: run one service (what compose and k8s run)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
from collections.abc import Awaitable, Callable
from types import ModuleType

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
    p = sub.add_parser(
        "service",
        help="run one service",
        description="Run one service; NAME --help lists its flags.",
    )
    p.add_argument("name", metavar="NAME", choices=list(SERVICES), help=", ".join(SERVICES))
    p.add_argument("flags", nargs=argparse.REMAINDER, help="the service's flags")
    p.set_defaults(func=run)


def service_parser(name: str, module: ModuleType) -> argparse.ArgumentParser:
    """The flags of one service: the common ones, then its own (`add_args`). Built
    only for the service asked for, so no command imports every service."""
    from shared.cli import _Parser

    q = _Parser(prog=f"rltune service {name}", description=(module.__doc__ or "").split("\n")[0])
    q.add_argument(
        "--prometheus-port",
        type=int,
        default=0,
        help="serve Prometheus /metrics on this port (default: off)",
    )
    q.add_argument(
        "--group-id",
        default=None,
        help="consumer group (default: <topic prefix><service name>)",
    )
    add_bus_args(q)
    if hasattr(module, "add_args"):
        module.add_args(q)
    return q


def run(args: argparse.Namespace) -> int:
    if args.name not in available():
        raise UserError(f"service {args.name!r} is not built into this checkout")
    module = importlib.import_module(SERVICES[args.name])
    opts = service_parser(args.name, module).parse_args(args.flags)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = bus_settings(opts)
    kwargs: dict[str, object] = {"group_id": opts.group_id} if opts.group_id else {}
    if hasattr(module, "from_args"):
        kwargs["conf"] = module.from_args(opts)
    serve_prometheus(opts.prometheus_port)
    UP.labels(args.name).set(1)
    run_async(_serve(module.serve, settings, kwargs))
    return 0


async def _serve(
    serve: Callable[..., Awaitable[object]], settings: BusSettings, kwargs: dict[str, object]
) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop)  # SIGTERM (compose, k8s) and Ctrl-C stop it cleanly
    await serve(settings, stop=stop, **kwargs)
