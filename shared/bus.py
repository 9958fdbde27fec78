"""The consumer loop every service runs, and the producer it publishes with.

A service is a handler: `Record -> Sequence[Outgoing]` (pure logic behind it).
Every service's entry point calls `shared.serving.serve`, which runs this loop
(`run_service`) with the service's own tasks. The loop does the rest, the same
way for every service:

* consume in batches with auto-commit off;
* call the handler per record; a `Reject` (or any exception from a handler)
  sends the record to its dead-letter topic with the reason (bounded in size,
  keyed like the input), counts it, and processing goes on: no byte string
  stops a service;
* publish every output, wait for the broker's acks, and only then commit the
  offsets that the work stands for (at-least-once delivery). A publish error
  never loses an input: a retriable one (broker gone, topic missing, timeout)
  is retried with backoff, the inputs uncommitted meanwhile; an output the
  broker can never take (too large) is answered by a dead letter instead;
* stamp every output with the input it came from (header `rltune-src`: topic,
  partition, offset and the input's fingerprint), so that a service that takes
  partitions over reads its own outputs back, recognises the inputs already
  answered, and skips them: exactly-once in effect, without transactions (which
  the embedded broker does not support). The fingerprint keeps an input of a
  topic deleted and recreated from passing for an older one at the same offset;
* own the handler's state with the partitions: whenever the group hands this
  instance partitions it did not hold without a break, the state is rebuilt
  from the outputs as they are then (`replay`), after the previous owner has
  published and committed its last batch (the revocation waits for the batch
  in flight). Two instances overlapping in a rolling update thus never both
  decide from a stale view;
* survive broker outages: retry with backoff, one log line per outage
  (`shared.health`), never exit for one;
* keep `shared.health.HEALTH[name]` current for the liveness and readiness probes;
* stop cleanly when `stop` is set (the commands set it on SIGTERM / SIGINT:
  `stop_on_signals`; a library call leaves the process's signals alone).

Service counters go out on the metrics topic every few seconds (a
`MetricsSnapshot` with `source` = the service) and to Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord

from shared.config import BusSettings
from shared.health import (
    BROKER,
    HEALTH,
    Backoff,
    ServiceHealth,
    quiet_aiokafka,
    quiet_unretrieved_kafka_futures,
)
from shared.messages import MetricsSnapshot, encode
from shared.prom import MESSAGES, PUBLISH_RETRIES, REJECTED
from shared.reject import Reject
from shared.wire import (
    MAX_MESSAGE_BYTES,
    MAX_REJECTION_BYTES,
    MAX_REQUEST_BYTES,
    SRC_HEADER,
    Message,
    Outgoing,
    Producer,
    Record,
    dead_letter,
    fingerprint,
    is_permanent,
    partitions_of,
    raw_text,
    read_back,
    read_to_end,
    refuse_oversized,
    source_of,
    to_record,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_REJECTION_BYTES",
    "MAX_REQUEST_BYTES",
    "SRC_HEADER",
    "Message",
    "Outgoing",
    "Producer",
    "Record",
    "Reject",
    "ServiceSpec",
    "ServiceStats",
    "Stopped",
    "dead_letter",
    "deliver",
    "fingerprint",
    "partitions_of",
    "raw_text",
    "read_back",
    "read_to_end",
    "run_service",
    "stop_on_signals",
]

log = logging.getLogger("rltune.bus")
FETCH_MAX_WAIT_MS = 20

_COMMIT_TIMEOUT_S = 30.0
_METRICS_TIMEOUT_S = 10.0


# A handler answers one record; plain functions are the fast path, coroutines are allowed.
Handler = Callable[[Record], Sequence[Outgoing] | Awaitable[Sequence[Outgoing]]]


@dataclass
class ServiceStats:
    """What a service counts: messages in and out, rejections by kind, batches."""

    consumed: int = 0
    published: int = 0
    skipped_redelivered: int = 0
    batches: int = 0
    publish_retries: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    extra: Counter[str] = field(default_factory=Counter)

    def snapshot(self, source: str) -> MetricsSnapshot:
        counters = {
            "consumed": float(self.consumed),
            "published": float(self.published),
            "skipped_redelivered": float(self.skipped_redelivered),
            "publish_retries": float(self.publish_retries),
            "rejected_total": float(sum(self.rejected.values())),
            **{k: float(v) for k, v in self.extra.items()},
        }
        return MetricsSnapshot(
            window=f"service:{source}",
            time=time.time(),
            rejected=dict(self.rejected),
            counters=counters,
            source=source,
        )


class _Redeliveries:
    """Inputs a service already answered, learned from its outputs: by position, and
    by fingerprint (an output without one, from an older version, matches by position)."""

    def __init__(self, service: str) -> None:
        self._prefix = f"{service}|".encode()
        self._done: dict[tuple[str, int], dict[int, str]] = defaultdict(dict)

    def learn(self, rec: Record) -> None:
        """Note the input `rec` answers, if `rec` is one of this service's outputs."""
        src = rec.header(SRC_HEADER)
        if not src or not src.startswith(self._prefix):
            return
        try:
            pos, _, fp = src[len(self._prefix) :].decode().partition("@")
            topic, part, off = pos.rsplit(":", 2)
            self._done[(topic, int(part))][int(off)] = fp
        except ValueError:  # not ours after all (a header someone else wrote)
            return

    def seen(self, rec: Record) -> bool:
        done = self._done.get((rec.topic, rec.partition))
        if not done:
            return False
        fp = done.get(rec.offset)
        if fp is None:
            return False
        if fp and fp != fingerprint(rec):  # same offset, another message: the topic was
            return False  # recreated; the entry stays for a re-read of the old one
        del done[rec.offset]
        return True

    def __len__(self) -> int:
        return sum(len(s) for s in self._done.values())

    def __bool__(self) -> bool:
        return any(self._done.values())


@dataclass
class ServiceSpec:
    """What `run_service` needs to know about one service."""

    name: str
    topics: Sequence[str]
    handle: Handler
    group_id: str = ""  # "" = `<topic prefix><name>`
    replay_topics: Sequence[str] = ()  # our own outputs, read back on taking partitions
    replay: Callable[[Record], None] | None = None  # rebuilds handler state from them
    # (`replay` sees every record of `replay_topics`; the service's own carry SRC_HEADER;
    # the dead-letter topics of `topics` are read back too, for SRC_HEADER alone)
    metrics_interval_s: float = 2.0
    max_batch: int = 5000


async def run_service(
    settings: BusSettings,
    spec: ServiceSpec,
    stop: asyncio.Event | None = None,
    stats: ServiceStats | None = None,
    ready: asyncio.Event | None = None,
    rebuild: Callable[[BusSettings, ServiceStats], ServiceSpec] | None = None,
) -> ServiceStats:
    """Run one service until `stop` is set. `ready` is set once it holds partitions
    with its state built. Without `rebuild`, `spec.replay` runs at the first
    assignment only (later takeovers re-read the answered inputs alone)."""
    quiet_aiokafka()
    quiet_unretrieved_kafka_futures()
    stop = stop or asyncio.Event()
    stats = stats or ServiceStats()
    health = HEALTH[spec.name] = ServiceHealth(spec.name)
    loop = _Loop(settings, spec, stats, health, rebuild, ready)
    try:
        await loop.start(stop)
        if not stop.is_set():
            await loop.run(stop)
    finally:
        health.stopped = True
        if HEALTH.get(spec.name) is health:  # the probes answer for running services
            del HEALTH[spec.name]
        await loop.close()
    return stats


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set `stop` on SIGTERM and SIGINT (for commands; the event loop must be running)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep, but wake at once when `stop` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class _Client(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


_C = TypeVar("_C", bound=_Client)


async def _started(client: _C, make: Callable[[], _C], stop: asyncio.Event, backoff: Backoff) -> _C:
    """`client` started, retrying with backoff until `stop`. A client whose start failed
    is stopped and not reused: `make` gives a fresh one for the next try."""
    while not stop.is_set():
        try:
            await client.start()
            return client
        except (KafkaError, OSError) as exc:
            BROKER.down(f"start: {exc}")
            with contextlib.suppress(Exception):
                await client.stop()
            client = make()
            await _pause(stop, backoff.next())
    return client


class Stopped(Exception):
    """`stop` was set while waiting for the broker: leave the inputs uncommitted."""


_T = TypeVar("_T")


def _dropped(name: str, stats: ServiceStats | None) -> Callable[[Any, BaseException], None]:
    def drop(_item: Any, err: BaseException) -> None:
        log.error("%s: dropped an output the broker refuses: %s", name, err)
        if stats is not None:
            stats.extra["unpublishable"] += 1

    return drop


async def deliver(
    producer: Producer,
    items: Sequence[_T],
    stop: asyncio.Event,
    name: str,
    message: Callable[[_T], Message],
    *,
    refused: Callable[[_T, BaseException], _T | None] | None = None,
    stats: ServiceStats | None = None,
    waiting: Callable[[], None] | None = None,
) -> int:
    """Publish every item's message: the one retry loop every output of every service
    goes through. What failed for want of the broker is retried with backoff (one
    outage line, `BROKER`'s state, `rltune_publish_retries_total`) for as long as the
    outage lasts; an item the broker refuses for good is handed to `refused`, which
    gives a replacement to publish instead (a dead letter of the input it answers) or
    None, and is otherwise dropped, logged and counted `unpublishable`. `waiting` is
    called before each pause (a health probe's sign of life). Raises Stopped if `stop`
    is set while waiting for the broker. Returns the count published."""
    drop = _dropped(name, stats)
    backoff = Backoff()
    done = 0
    pending = list(items)
    while pending:
        errors = await producer.publish_each([message(i) for i in pending])
        retry: list[_T] = []
        transient: BaseException | None = None
        for item, err in zip(pending, errors, strict=True):
            if err is None:
                done += 1
            elif is_permanent(err):
                instead = refused(item, err) if refused is not None else None
                if instead is None:
                    drop(item, err)
                else:
                    retry.append(instead)
            else:
                retry.append(item)
                transient = transient or err
        if transient is None:
            if len(retry) < len(pending):
                BROKER.ok()
        else:
            BROKER.down(f"publish: {transient}")
            if stats is not None:
                stats.publish_retries += 1
            PUBLISH_RETRIES.labels(name).inc()
            if stop.is_set():
                raise Stopped
            if waiting is not None:
                waiting()
            await _pause(stop, backoff.next())
        pending = retry
    return done


@dataclass(slots=True)
class _Answer:
    out: Outgoing
    headers: list[tuple[str, bytes]]
    rec: Record | None  # the input it answers (None: a metrics snapshot)
    fallback: bool = False  # already a dead letter in place of an unpublishable output


def _learner(
    redelivered: _Redeliveries, spec: ServiceSpec, replay: Callable[[Record], None] | None
) -> Callable[[Record], None]:
    """What a read-back does with each record: note the inputs answered, and feed
    the replay topics' records to the handler's `replay`."""
    replay_topics = frozenset(spec.replay_topics)

    def learn(rec: Record) -> None:
        redelivered.learn(rec)
        if replay is not None and rec.topic in replay_topics:
            replay(rec)

    return learn


class _Ownership(ConsumerRebalanceListener):
    """Hands partitions over between instances without a gap in the state's view."""

    def __init__(self, loop: _Loop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self.loop.lock:  # the batch in flight is published and committed first
            self.loop.generation += 1
            self.loop.health.assigned = False

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self.loop.lock:
            self.loop.generation += 1
            await self.loop.take(frozenset(assigned))


class _Loop:
    """The consume → handle → publish → commit cycle of one service."""

    def __init__(
        self,
        settings: BusSettings,
        spec: ServiceSpec,
        stats: ServiceStats,
        health: ServiceHealth,
        rebuild: Callable[[BusSettings, ServiceStats], ServiceSpec] | None,
        ready: asyncio.Event | None,
    ) -> None:
        self.settings = settings
        self.spec = spec
        self.stats = stats
        self.health = health
        self.rebuild = rebuild
        self.ready = ready
        self.redelivered = _Redeliveries(spec.name)
        self.lock = asyncio.Lock()
        self.generation = 0  # bumped by every revocation and assignment
        self.held: frozenset[TopicPartition] = frozenset()  # owned without a break
        self.built = False  # handler state rebuilt at least once
        self.group_generation = -1
        self.stop = asyncio.Event()
        self.producer = Producer(settings, client_id=spec.name)
        self.consumer = self._consumer()
        self.metrics_task: asyncio.Task[None] | None = None  # the snapshot being published
        self._set_handler(spec)

    def _consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            **self.settings.client_kwargs(),
            group_id=self.spec.group_id or f"{self.settings.topic_prefix}{self.spec.name}",
            client_id=self.spec.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 << 20,
            fetch_max_bytes=32 << 20,
            # an empty fetch comes back after this long: what a round trip through an
            # idle service costs when the broker does not answer a waiting fetch as soon
            # as data arrives (the embedded one does not; aiokafka's default is 500 ms)
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        )

    def _set_handler(self, spec: ServiceSpec) -> None:
        self.spec = spec
        handle = spec.handle
        self._async = inspect.iscoroutinefunction(handle) or inspect.iscoroutinefunction(
            getattr(handle, "__call__", None)  # noqa: B004 - a handler object's method
        )

    # ---- start-up and shutdown ----

    async def start(self, stop: asyncio.Event) -> None:
        """Connect (retrying with backoff until `stop`) and subscribe. A client whose
        start failed is not reused: a fresh one is made for the next try."""
        self.stop = stop
        backoff = Backoff()
        self.producer = await _started(
            self.producer, lambda: Producer(self.settings, client_id=self.spec.name), stop, backoff
        )
        self.consumer = await _started(self.consumer, self._consumer, stop, backoff)
        if not stop.is_set():
            BROKER.ok()
            self.consumer.subscribe(list(self.spec.topics), listener=_Ownership(self))

    async def close(self) -> None:
        if self.metrics_task is not None and not self.metrics_task.done():
            self.metrics_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.metrics_task
        with contextlib.suppress(Exception):  # last counters; never block a shutdown
            await asyncio.wait_for(self.producer.publish([(self.metrics_message(), [])]), 2.0)
        for part in (self.consumer, self.producer):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(part.stop(), 10.0)

    # ---- ownership of the partitions and of the state built from them ----

    async def take(self, assigned: frozenset[TopicPartition]) -> None:
        """Partitions assigned (under the lock): rebuild the state unless this instance
        held exactly these without a break (then nobody else answered them since)."""
        gen = getattr(getattr(self.consumer, "_coordinator", None), "generation", -1)
        unbroken = self.built and assigned == self.held and gen == self.group_generation + 1
        self.group_generation = gen
        self.held = assigned
        if assigned and not unbroken:
            await self._rebuild()
        self.health.assigned = bool(assigned)
        if assigned and self.ready is not None:
            self.ready.set()

    async def _rebuild(self) -> None:
        """Fresh handler state and answered-input record, read back from the outputs
        as they are now (retrying until it succeeds or the service stops)."""
        backoff = Backoff()
        t = self.settings.topics
        dlqs = [t.dead_letter(x) for x in self.spec.topics]
        while not self.stop.is_set():
            if self.rebuild is not None:
                spec = self.rebuild(self.settings, self.stats)
                replay = spec.replay
            else:
                spec = self.spec
                replay = None if self.built else spec.replay
            redelivered = _Redeliveries(spec.name)
            topics = list(dict.fromkeys([*spec.replay_topics, *dlqs]))
            try:
                await read_back(self.settings, topics, _learner(redelivered, spec, replay))
            except (KafkaError, OSError) as exc:
                BROKER.down(f"read back: {exc}")
                await _pause(self.stop, backoff.next())
                continue
            self._set_handler(spec)
            self.redelivered = redelivered
            self.built = True
            log.info(
                "%s: took partitions over; %d answered inputs read back",
                spec.name,
                len(redelivered),
            )
            return

    # ---- the loop ----

    async def run(self, stop: asyncio.Event) -> None:
        next_metrics = time.monotonic() + self.spec.metrics_interval_s
        backoff = Backoff()
        while not stop.is_set():
            gen = self.generation
            try:
                batch = await self.consumer.getmany(timeout_ms=200, max_records=self.spec.max_batch)
                if batch:
                    await self._process(batch, gen)
                backoff.reset()
            except Stopped:
                break
            except (KafkaError, OSError) as exc:
                BROKER.down(f"consume: {exc}")
                await _pause(stop, backoff.next())
            if time.monotonic() >= next_metrics:
                # beside the loop, one snapshot in flight at a time: a publish the broker
                # will not take waits out its timeout without holding up the inputs
                if self.metrics_task is None or self.metrics_task.done():
                    self.metrics_task = asyncio.create_task(self._publish_metrics())
                next_metrics = time.monotonic() + self.spec.metrics_interval_s
            self.health.turn()

    def metrics_message(self) -> Outgoing:
        snap = self.stats.snapshot(self.spec.name)
        return Outgoing(self.settings.topics.metrics, self.spec.name, encode(snap))

    async def _publish_metrics(self) -> None:
        """Counters on the metrics topic; a failure is logged (once per outage), never fatal."""
        try:
            (err,) = await asyncio.wait_for(
                self.producer.publish_each([(self.metrics_message(), [])]), _METRICS_TIMEOUT_S
            )
        except TimeoutError as exc:
            err = exc
        if err is None:
            BROKER.ok()
        else:
            BROKER.down(f"metrics publish: {err}")

    async def _process(self, batch: dict[TopicPartition, list[ConsumerRecord]], gen: int) -> None:
        async with self.lock:
            if gen != self.generation:  # fetched before a rebalance: the owner answers,
                self._refetch(batch)  # which may be this instance again
                return
            answers: list[_Answer] = []
            commits: dict[TopicPartition, int] = {}
            n_in = 0
            seen = self.redelivered.seen if self.redelivered else None
            for tp, msgs in batch.items():
                if tp not in self.held:
                    continue
                n_in += len(msgs)
                for m in msgs:
                    rec = to_record(m)
                    if seen is not None and seen(rec):
                        self.stats.skipped_redelivered += 1
                        continue
                    headers = [(SRC_HEADER, source_of(self.spec.name, rec))]
                    answer = await self._answer_async(rec) if self._async else self._answer(rec)
                    answers += [_Answer(out, headers, rec) for out in answer]
                commits[tp] = msgs[-1].offset + 1
            published = await self._deliver(answers)  # published and acknowledged ...
            await self._commit(commits)  # ... before the inputs count as done
            self.stats.consumed += n_in
            self.stats.published += published
            self.stats.batches += 1
            MESSAGES.labels(self.spec.name, "consumed").inc(n_in)
            MESSAGES.labels(self.spec.name, "published").inc(published)

    def _refetch(self, batch: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Put the position of every partition still assigned back to the batch's start."""
        assigned = self.consumer.assignment()
        for tp, msgs in batch.items():
            if tp in assigned and msgs:
                self.consumer.seek(tp, msgs[0].offset)

    async def _deliver(self, answers: list[_Answer]) -> int:
        """Publish every answer through `deliver`; an answer the broker can never take
        is replaced by a dead letter of its input. Raises Stopped if the service stops
        first. Returns the count published."""
        return await deliver(
            self.producer,
            answers,
            self.stop,
            self.spec.name,
            lambda a: (a.out, a.headers),
            refused=self._refused,
            stats=self.stats,
            waiting=self.health.turn,
        )

    def _refused(self, a: _Answer, err: BaseException) -> _Answer | None:
        return None if a.rec is None or a.fallback else self._unpublishable(a, err)

    def _unpublishable(self, a: _Answer, err: BaseException) -> _Answer:
        assert a.rec is not None
        size = len(a.out.value) + len(a.out.key or b"")
        rej = Reject(
            f"the answer to this message ({size} bytes on {a.out.topic}) could not be "
            f"published: {type(err).__name__}: {err}",
            key=a.out.key.decode("utf-8", "replace")
            if isinstance(a.out.key, bytes)
            else a.out.key or "",
            kind="unpublishable",
        )
        self._count_reject(rej.kind)
        return _Answer(dead_letter(self.settings, a.rec, rej), a.headers, a.rec, fallback=True)

    async def _commit(self, commits: dict[TopicPartition, int]) -> None:
        backoff = Backoff()
        while commits:
            try:
                await asyncio.wait_for(self.consumer.commit(commits), _COMMIT_TIMEOUT_S)
                BROKER.ok()
                return
            except (CommitFailedError, IllegalStateError) as exc:
                # the group moved on: the new owner reads our answers back and skips them
                log.warning("%s: commit refused (%s); the new owner skips these inputs",
                            self.spec.name, exc)  # fmt: skip
                self.held = frozenset()
                return
            except (KafkaError, OSError, TimeoutError) as exc:
                BROKER.down(f"commit: {exc}")
                if self.stop.is_set():
                    raise Stopped from None
                self.health.turn()
                await _pause(self.stop, backoff.next())

    def _answer(self, rec: Record) -> Sequence[Outgoing]:
        try:
            refuse_oversized(rec)
            return self.spec.handle(rec)  # type: ignore[return-value]
        except Exception as exc:
            return self._refuse(rec, exc)

    async def _answer_async(self, rec: Record) -> Sequence[Outgoing]:
        try:
            refuse_oversized(rec)
            return await self.spec.handle(rec)  # type: ignore[misc]
        except Exception as exc:
            return self._refuse(rec, exc)

    def _refuse(self, rec: Record, exc: Exception) -> Sequence[Outgoing]:
        """The dead-letter answer to a record the handler refused (or failed on)."""
        if isinstance(exc, Reject):
            self._count_reject(exc.kind)
            return [dead_letter(self.settings, rec, exc)]
        # a handler bug must not stop the service
        log.error("%s: handler failed on %s", self.spec.name, rec.source, exc_info=exc)
        bug = Reject(f"internal error handling message: {type(exc).__name__}: {exc}")
        self._count_reject("internal_error")
        return [dead_letter(self.settings, rec, bug)]

    def _count_reject(self, kind: str) -> None:
        self.stats.rejected[kind] += 1
        REJECTED.labels(self.spec.name, kind).inc()
