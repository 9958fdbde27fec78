"""Prometheus metrics of the services (DESIGN.md naming: prefix `rltune_`, base units,
`_total` / `_seconds` / `_bytes` suffixes). `serve_prometheus` exposes them over HTTP."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = ["MESSAGES", "QUEUE_WAIT", "REJECTED", "SOLVE_SECONDS", "UP", "serve_prometheus"]

MESSAGES = Counter(
    "rltune_messages_total", "Messages consumed or published by a service", ["service", "direction"]
)
REJECTED = Counter(
    "rltune_rejected_total",
    "Messages sent to a dead-letter topic, by reason",
    ["service", "reason"],
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
UP = Gauge("rltune_service_up", "1 while the service runs", ["service"])


def serve_prometheus(port: int) -> None:
    """Expose /metrics on `port` (0 = do not serve)."""
    if port:
        start_http_server(port)
