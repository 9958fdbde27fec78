"""Prometheus metrics of the services (DESIGN.md naming: prefix `rltune_`, base units,
`_total` / `_seconds` / `_bytes` suffixes) and the HTTP endpoint that serves them
beside the probes: `/metrics`, `/healthz` (liveness) and `/readyz` (readiness)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from shared.errors import UserError
from shared.health import HEALTH, OUTAGES

__all__ = [
    "MESSAGES",
    "OUTAGES",
    "PUBLISH_RETRIES",
    "QUEUE_WAIT",
    "READY",
    "REJECTED",
    "SOLVE_SECONDS",
    "UP",
    "serve_http",
    "serve_prometheus",
    "track",
]

MESSAGES = Counter(
    "rltune_messages_total", "Messages consumed or published by a service", ["service", "direction"]
)
REJECTED = Counter(
    "rltune_rejected_total",
    "Messages sent to a dead-letter topic, by reason",
    ["service", "reason"],
)
PUBLISH_RETRIES = Counter(
    "rltune_publish_retries_total",
    "Publish attempts retried after an error (the inputs stay uncommitted meanwhile)",
    ["service"],
)
QUEUE_WAIT = Histogram(
    "rltune_queue_wait_seconds",
    "Time from submission to first start",
    ["queue"],
    buckets=(1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400),
)
SOLVE_SECONDS = Histogram(
    "rltune_placement_solve_seconds",
    "Wall time of one placement solve",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
)
UP = Gauge("rltune_service_up", "1 while the service's consume loop turns (liveness)", ["service"])
READY = Gauge(
    "rltune_service_ready",
    "1 while the service is connected, assigned and turning (readiness)",
    ["service"],
)


def track(name: str) -> None:
    """Export the service's liveness and readiness as gauges, computed at each scrape."""
    UP.labels(name).set_function(lambda: float(_probe(name, live=True)[0]))
    READY.labels(name).set_function(lambda: float(_probe(name, live=False)[0]))


def _probe(name: str | None, live: bool) -> tuple[bool, str]:
    healths = [HEALTH[name]] if name in HEALTH else list(HEALTH.values())
    if not healths:
        return (live, "no service running yet")
    for h in healths:
        ok, why = h.live() if live else h.ready()
        if not ok:
            return False, f"{h.name}: {why}"
    return True, "ok"


Start = Callable[[str, list[tuple[str, str]]], Any]


def _app(metrics: Callable[[dict[str, Any], Start], Iterable[bytes]]) -> Any:
    def app(environ: dict[str, Any], start: Start) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok, why = _probe(None, live=path == "/healthz")
            start("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"{why}\n".encode()]
        if path in ("/metrics", "/"):
            return metrics(environ, start)
        start("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    return app


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log: probes call every few seconds."""


def serve_http(port: int, address: str = "127.0.0.1") -> WSGIServer | None:
    """Serve /metrics, /healthz and /readyz on `address`:`port` from a daemon thread
    (port 0 = do not serve). A port in use or an address not on this host is a
    UserError."""
    if not port:
        return None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    class Server(ThreadingWSGIServer):
        address_family = family

    try:
        httpd = make_server(address, port, _app(make_wsgi_app()), Server, handler_class=_Quiet)
    except OSError as exc:
        raise UserError(
            f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}"
        ) from None
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd


def serve_prometheus(port: int, address: str = "127.0.0.1") -> None:
    """`serve_http` under its former name."""
    serve_http(port, address)
