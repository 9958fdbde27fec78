"""How a service is doing: the broker outage log line, retry backoff, and the state
behind the liveness and readiness probes.

* `BROKER` is the process's view of the Kafka connection. The first sign of trouble
  (a failed publish or commit, or a connection error logged by aiokafka) logs ONE
  line; the first success after it logs one more, with the outage's length.
  aiokafka's own connection errors (about a hundred a second while a broker is
  down) are dropped by a filter on its loggers and only counted.
* `Backoff`: the delays between retries, doubling up to a cap.
* `ServiceHealth` (one per running service, in `HEALTH`): live while its consume
  loop keeps turning; ready while it is also connected, has partitions assigned
  and has turned recently. `shared.prom.serve_http` answers `/healthz` and
  `/readyz` from it.

Threads: the probes are read from the HTTP server's thread; every field written
here is a single attribute store, which is atomic in CPython.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError
from prometheus_client import Counter

__all__ = [
    "BROKER",
    "HEALTH",
    "OUTAGES",
    "Backoff",
    "BrokerState",
    "ServiceHealth",
    "quiet_aiokafka",
    "quiet_unretrieved_kafka_futures",
]

log = logging.getLogger("rltune.bus")

OUTAGES = Counter("rltune_broker_outages_total", "Times this process lost the Kafka broker")

# aiokafka log records that mean "the broker cannot be reached" (not bugs)
_CONNECTION = re.compile(
    r"connect|Connection|coordinator|Coordinator|metadata|NodeNotReady|[Tt]imed? ?out|"
    r"not available|Unable|bootstrap|Errno|UnknownError|Failed fetch",
)


class BrokerState:
    """One line when the broker is lost, one when it is back; counts outages.

    An outage ends once requests have succeeded for `settle_s` with no new trouble:
    a broker coming back brings a burst of after-effects (the group coordinator
    moved, topics not yet recreated) that belong to the same outage."""

    def __init__(self, settle_s: float = 5.0) -> None:
        self._lock = threading.Lock()
        self.settle_s = settle_s
        self.down_since: float | None = None
        self.last_trouble = 0.0
        self.ok_since = 0.0  # first success since the last trouble
        self.outages = 0
        self.last_ok = 0.0  # monotonic time of the last acknowledged request
        self.dropped_client_logs = 0

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    def down(self, reason: object) -> None:
        """Something failed for want of the broker; logs once per outage."""
        with self._lock:
            self.last_trouble = time.monotonic()
            if self.down_since is not None:
                return
            self.down_since = self.last_trouble
            self.outages += 1
        OUTAGES.inc()
        log.warning("Kafka broker unreachable (%s); retrying with backoff", _short(reason))

    def ok(self) -> None:
        """A request was acknowledged: the broker is there (for good once requests
        have kept succeeding for `settle_s`)."""
        now = self.last_ok = time.monotonic()
        if self.down_since is None:
            return
        with self._lock:
            if self.ok_since < self.last_trouble:
                self.ok_since = now
            if self.down_since is None or now - self.ok_since < self.settle_s:
                return
            since, self.down_since = self.down_since, None
        log.warning("Kafka broker reachable again after %.1f s", now - since)


BROKER = BrokerState()


def _short(reason: object) -> str:
    text = (
        f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    )
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


class _ClientLogFilter(logging.Filter):
    """Turns aiokafka's connection-error flood into `BROKER.down`'s one line (or into
    nothing, for a one-shot command that reports the failure itself)."""

    announce = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: let logging report it
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if _CONNECTION.search(text) or isinstance(exc, OSError | ConnectionError):
            BROKER.dropped_client_logs += 1
            if self.announce:
                BROKER.down(text)
            return False
        return True


_FILTER = _ClientLogFilter()
_CLIENT_LOGGERS = (
    "aiokafka",
    "aiokafka.conn",
    "aiokafka.client",
    "aiokafka.cluster",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
    "aiokafka.admin.client",
)


def quiet_aiokafka(announce: bool = True) -> None:
    """Install the filter on aiokafka's loggers (idempotent). A filter on a logger
    does not apply to its children's records, so each logger gets it. With
    `announce`, the first dropped record of an outage logs BROKER's one line."""
    _FILTER.announce = _FILTER.announce or announce
    for name in _CLIENT_LOGGERS:
        lg = logging.getLogger(name)
        if _FILTER not in lg.filters:
            lg.addFilter(_FILTER)


def _unretrieved_kafka_error(context: dict[str, object]) -> bool:
    fut, exc = context.get("future"), context.get("exception")
    return (
        isinstance(fut, asyncio.Future)
        and not isinstance(fut, asyncio.Task)
        and isinstance(exc, KafkaError)
        and str(context.get("message", "")).startswith("Future exception was never retrieved")
    )


def quiet_unretrieved_kafka_futures(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Drop, on this event loop, the "Future exception was never retrieved" report of
    a plain future that failed with a Kafka error; pass everything else on.

    The source is aiokafka's MessageBatch: a failed batch sets its exception on a
    drain waiter as well as on the future `send_batch` returns, and in the explicit
    batch API (what `Producer.publish_each` uses) nothing ever awaits that waiter,
    so every batch that meets an outage leaves one such report when it is collected.
    The failure itself is not lost: `publish_each` reads it from the batch's future,
    `deliver` retries, and `BROKER` logs the outage once. Tasks, other exceptions and
    every other report go to the handler that was there before (idempotent)."""
    loop = loop or asyncio.get_running_loop()
    before = loop.get_exception_handler()
    if getattr(before, "_rltune_quiet", False):
        return

    def handle(lp: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        if _unretrieved_kafka_error(context):
            log.debug("%s", context.get("message"))
            return
        if before is not None:
            before(lp, context)
        else:
            lp.default_exception_handler(context)

    handle._rltune_quiet = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handle)


@dataclass
class Backoff:
    """Retry delays: `first`, doubling, at most `cap` seconds."""

    first: float = 0.2
    cap: float = 10.0
    _next: float = 0.0

    def next(self) -> float:
        delay = self._next or self.first
        self._next = min(delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._next = 0.0


@dataclass
class ServiceHealth:
    """What the probes of one service report.

    live: the consume loop completed a cycle within `live_after_s` (a loop blocked by
    a handler, or dead, stops turning). ready: live within `ready_after_s`, connected
    to the broker, and holding at least one partition of its input topics."""

    name: str
    ready_after_s: float = 30.0
    live_after_s: float = 120.0
    started: float = field(default_factory=time.monotonic)
    beat: float = 0.0  # monotonic time the loop last completed a cycle
    assigned: bool = False
    stopped: bool = False

    def turn(self) -> None:
        self.beat = time.monotonic()

    def _since_beat(self) -> float:
        return time.monotonic() - (self.beat or self.started)

    def live(self) -> tuple[bool, str]:
        if self.stopped:
            return False, "stopped"
        idle = self._since_beat()
        if idle > self.live_after_s:
            return False, f"consume loop stuck for {idle:.0f} s"
        return True, "consume loop turning"

    def ready(self) -> tuple[bool, str]:
        ok, why = self.live()
        if not ok:
            return False, why
        if not self.beat:
            return False, "starting"
        idle = self._since_beat()
        if idle > self.ready_after_s:
            return False, f"consume loop has not turned for {idle:.0f} s"
        if BROKER.is_down or not BROKER.last_ok:
            return False, "not connected to the Kafka broker"
        if not self.assigned:
            return False, "no input partitions assigned"
        return True, "ready"


HEALTH: dict[str, ServiceHealth] = {}
