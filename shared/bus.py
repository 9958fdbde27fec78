"""The consumer loop every service runs, and the producer it publishes with.

A service is a handler: `Record -> Sequence[Outgoing]` (pure logic behind it).
`run_service` does the rest, the same way for every service:

* consume in batches with auto-commit off;
* call the handler per record; a `Reject` (or any exception from a handler)
  sends the record to its dead-letter topic with the reason, counts it, and
  processing goes on: no byte string stops a service;
* publish every output, wait for the broker's acks, and only then commit the
  offsets that the work stands for (at-least-once delivery);
* stamp every output with the input it came from (header `rltune-src`), so that
  after a crash a restarted service reads its own outputs back, recognises the
  inputs it had already answered, and skips them: exactly-once in effect,
  without transactions (which the embedded broker does not support). The
  handler's own state is rebuilt from the same read-back (`replay`);
* stop cleanly when `stop` is set (the commands set it on SIGTERM / SIGINT:
  `stop_on_signals`; a library call leaves the process's signals alone).

Service counters go out on the metrics topic every few seconds (a
`MetricsSnapshot` with `source` = the service) and to Prometheus.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import logging
import signal
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord

from shared.config import BusSettings
from shared.messages import MetricsSnapshot, Rejection, encode
from shared.prom import MESSAGES, REJECTED
from shared.reject import Reject

__all__ = [
    "SRC_HEADER",
    "Outgoing",
    "Producer",
    "Record",
    "Reject",
    "ServiceStats",
    "dead_letter",
    "partitions_of",
    "raw_text",
    "read_back",
    "read_to_end",
    "run_service",
    "serve_service",
    "stop_on_signals",
]

log = logging.getLogger("rltune.bus")

# On every output: "<service>|<topic>:<partition>:<offset>", the service that published
# it and the input it answers (one header, not two: it is paid for on every message).
SRC_HEADER = "rltune-src"
MAX_MESSAGE_BYTES = 1 << 20
FETCH_MAX_WAIT_MS = 20
RAW_KEEP_BYTES = 1 << 16  # of a rejected message over MAX_MESSAGE_BYTES
_TOO_LARGE = "message of {} bytes exceeds 1 MiB (raw holds its first 65536 bytes)"


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 2x, per message
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def source(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass(slots=True)
class Outgoing:
    topic: str
    key: str | bytes | None
    value: bytes


# A handler answers one record; plain functions are the fast path, coroutines are allowed.
Handler = Callable[[Record], Sequence[Outgoing] | Awaitable[Sequence[Outgoing]]]


@dataclass
class ServiceStats:
    """What a service counts: messages in and out, rejections by kind, batches."""

    consumed: int = 0
    published: int = 0
    skipped_redelivered: int = 0
    batches: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    extra: Counter[str] = field(default_factory=Counter)

    def snapshot(self, source: str) -> MetricsSnapshot:
        counters = {
            "consumed": float(self.consumed),
            "published": float(self.published),
            "skipped_redelivered": float(self.skipped_redelivered),
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


def raw_text(value: bytes | None) -> str:
    """The bytes as received: UTF-8 text, else "base64:" + base64."""
    if value is None:
        return ""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode("ascii")


def dead_letter(settings: BusSettings, rec: Record, rej: Reject) -> Outgoing:
    """The dead-letter message for a record a handler refused. The raw bytes of an
    oversized record are cut to their first RAW_KEEP_BYTES (the reason says so), so that
    the rejection itself stays publishable."""
    value = rec.value
    if value is not None and len(value) > MAX_MESSAGE_BYTES:
        value = value[:RAW_KEEP_BYTES]
    msg = Rejection(
        job_id=rej.key,
        reason=rej.reason,
        raw=raw_text(value),
        topic=rec.topic,
        time=rec.timestamp_ms / 1000.0,
    )
    return Outgoing(settings.topics.dead_letter(rec.topic), rej.key or None, encode(msg))


def _to_record(m: ConsumerRecord) -> Record:
    return Record(
        topic=m.topic,
        partition=m.partition,
        offset=m.offset,
        key=m.key,
        value=m.value,
        timestamp_ms=m.timestamp or 0,
        headers=tuple(m.headers or ()),
    )


class Producer:
    """An aiokafka producer with the project's settings, as an async context manager."""

    def __init__(self, settings: BusSettings, client_id: str = "rltune") -> None:
        self._p = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap,
            client_id=client_id,
            acks="all",
            linger_ms=2,
            max_batch_size=1 << 20,
            max_request_size=4 << 20,
            enable_idempotence=False,  # exactly-once effect comes from idempotent consumers
        )
        self._parts: dict[str, list[int]] = {}
        self._partitioner = DefaultPartitioner()

    async def __aenter__(self) -> Producer:
        await self._p.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._p.stop()

    async def send(
        self,
        topic: str,
        key: str | bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[object]:
        """Queue one message; the returned future resolves when the broker has it."""
        k = key.encode() if isinstance(key, str) else key
        return await self._p.send(topic, value, key=k, headers=list(headers) if headers else None)

    async def publish(self, outs: Sequence[tuple[Outgoing, list[tuple[str, bytes]]]]) -> int:
        """Publish many messages in as few record batches as they fit in, and wait for
        every ack. Headers go as a list (aiokafka's batch builder takes no tuple). Keys
        choose partitions the way Kafka's default partitioner does (murmur2), so keyed
        order holds across clients."""
        groups: dict[tuple[str, int], list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]]
        groups = defaultdict(list)
        for out, headers in outs:
            key = out.key.encode() if isinstance(out.key, str) else out.key
            parts = self._parts.get(out.topic) or await self._partitions(out.topic)
            groups[(out.topic, self._partition(parts, key))].append((key, out.value, headers))
        futs = []
        for (topic, part), msgs in groups.items():
            batch = self._p.create_batch()
            for key, value, headers in msgs:
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    futs.append(await self._p.send_batch(batch, topic, partition=part))
                    batch = self._p.create_batch()
                    if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                        # larger than a whole batch: on its own (up to max_request_size)
                        futs.append(await self.send(topic, key, value, headers))
            futs.append(await self._p.send_batch(batch, topic, partition=part))
        if futs:
            await asyncio.gather(*futs)
        return len(outs)

    def _partition(self, parts: list[int], key: bytes | None) -> int:
        if len(parts) == 1:
            return parts[0]
        return int(self._partitioner(key, parts, parts))

    async def _partitions(self, topic: str) -> list[int]:
        parts = self._parts.get(topic)
        if parts is None:
            parts = sorted(await self._p.partitions_for(topic))
            self._parts[topic] = parts
        return parts

    async def flush(self) -> None:
        await self._p.flush()


async def read_to_end(
    c: AIOKafkaConsumer, parts: Sequence[TopicPartition], *, max_records: int = 10_000
) -> AsyncIterator[list[ConsumerRecord]]:
    """Every record of the assigned `parts` from the consumer's position up to the
    end of each partition as it is when the partition is first fetched.

    The end is the larger of ListOffsets' answer and the high watermark of that
    first fetch: the embedded broker answers ListOffsets with the first offset
    of the last record batch plus one, not the end of the log, and a reader that
    stopped there would miss the rest of that batch (up to a whole publish)."""
    end = await c.end_offsets(list(parts))
    todo = {tp for tp in parts if end[tp] > 0}
    settled: set[TopicPartition] = set()
    while todo:
        batch = await c.getmany(*todo, timeout_ms=500, max_records=max_records)
        for tp, msgs in batch.items():
            if tp not in settled:
                settled.add(tp)
                end[tp] = max(end[tp], c.highwater(tp) or 0)
            yield msgs
        for tp in list(todo):
            if tp in settled and await c.position(tp) >= end[tp]:
                todo.discard(tp)


async def read_back(
    settings: BusSettings,
    topics: Sequence[str],
    on_record: Callable[[Record], None],
) -> dict[str, int]:
    """Read `topics` from the beginning to their current end, calling `on_record` for
    each record. Returns the count of records seen by topic."""
    c = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
    )
    await c.start()
    seen: Counter[str] = Counter()
    try:
        parts = await partitions_of(c, topics)
        if not parts:
            return {}
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        async for msgs in read_to_end(c, parts):
            for m in msgs:
                seen[m.topic] += 1
                on_record(_to_record(m))
    finally:
        await c.stop()
    return dict(seen)


async def partitions_of(consumer: AIOKafkaConsumer, topics: Sequence[str]) -> list[TopicPartition]:
    """Every partition of `topics` that exists (metadata refreshed first)."""
    await consumer.topics()
    return [
        TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or [])
    ]


class _Redeliveries:
    """Input positions a service already answered (learned from its outputs at start-up)."""

    def __init__(self, service: str) -> None:
        self._prefix = f"{service}|".encode()
        self._done: dict[tuple[str, int], set[int]] = defaultdict(set)

    def learn(self, rec: Record) -> None:
        """Note the input `rec` answers, if `rec` is one of this service's outputs."""
        src = rec.header(SRC_HEADER)
        if not src or not src.startswith(self._prefix):
            return
        topic, part, off = src[len(self._prefix) :].decode().rsplit(":", 2)
        self._done[(topic, int(part))].add(int(off))

    def seen(self, rec: Record) -> bool:
        done = self._done.get((rec.topic, rec.partition))
        if not done:
            return False
        if rec.offset in done:
            done.discard(rec.offset)
            return True
        return False

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
    replay_topics: Sequence[str] = ()  # our own outputs, read back at start
    replay: Callable[[Record], None] | None = None  # rebuilds handler state from them
    # (`replay` sees every record of `replay_topics`; the service's own carry SRC_HEADER)
    metrics_interval_s: float = 2.0
    max_batch: int = 5000


async def serve_service(
    settings: BusSettings,
    build: Callable[[BusSettings, ServiceStats], ServiceSpec],
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
) -> ServiceStats:
    """Build a service's spec around fresh counters and run it; `group_id` overrides
    the default consumer group (`<topic prefix><service name>`)."""
    stats = ServiceStats()
    spec = build(settings, stats)
    if group_id:
        spec.group_id = group_id
    return await run_service(settings, spec, stop, stats, ready)


async def run_service(
    settings: BusSettings,
    spec: ServiceSpec,
    stop: asyncio.Event | None = None,
    stats: ServiceStats | None = None,
    ready: asyncio.Event | None = None,
) -> ServiceStats:
    """Run one service until `stop` is set."""
    stop = stop or asyncio.Event()
    stats = stats or ServiceStats()
    redelivered = _Redeliveries(spec.name)

    def learn(rec: Record) -> None:
        redelivered.learn(rec)
        if spec.replay is not None:
            spec.replay(rec)

    if spec.replay_topics:
        await read_back(settings, spec.replay_topics, learn)
        log.info("%s: read back %d answered inputs", spec.name, len(redelivered))
    consumer = AIOKafkaConsumer(
        *spec.topics,
        bootstrap_servers=settings.bootstrap,
        group_id=spec.group_id or f"{settings.topic_prefix}{spec.name}",
        client_id=spec.name,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=32 << 20,
        # a fetch that finds nothing comes back after this long: what a round trip
        # through an idle service costs when the broker does not answer a waiting
        # fetch as soon as data arrives (the embedded one does not)
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
    )
    async with Producer(settings, client_id=spec.name) as producer:
        await consumer.start()
        loop = _Loop(settings, spec, consumer, producer, stats, redelivered)
        if ready is not None:
            ready.set()
        try:
            await loop.run(stop)
        finally:
            with contextlib.suppress(Exception):  # last counters; never block a shutdown
                await asyncio.wait_for(producer.publish([(loop.metrics_message(), [])]), 2.0)
            await consumer.stop()
    return stats


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set `stop` on SIGTERM and SIGINT (for commands; the event loop must be running)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)


def _refuse_oversized(rec: Record) -> None:
    if rec.value is not None and len(rec.value) > MAX_MESSAGE_BYTES:
        raise Reject(_TOO_LARGE.format(len(rec.value)), kind="too_large")


class _Loop:
    """The consume → handle → publish → commit cycle of one service."""

    def __init__(
        self,
        settings: BusSettings,
        spec: ServiceSpec,
        consumer: AIOKafkaConsumer,
        producer: Producer,
        stats: ServiceStats,
        redelivered: _Redeliveries,
    ) -> None:
        self.settings = settings
        self.spec = spec
        self.consumer = consumer
        self.producer = producer
        self.stats = stats
        self.redelivered = redelivered
        handle = spec.handle
        self._async = inspect.iscoroutinefunction(handle) or inspect.iscoroutinefunction(
            getattr(handle, "__call__", None)  # noqa: B004 - a handler object's method
        )

    async def run(self, stop: asyncio.Event) -> None:
        next_metrics = time.monotonic() + self.spec.metrics_interval_s
        while not stop.is_set():
            batch = await self.consumer.getmany(timeout_ms=200, max_records=self.spec.max_batch)
            if batch:
                await self._process(batch)
            if time.monotonic() >= next_metrics:
                await self.producer.publish([(self.metrics_message(), [])])
                next_metrics = time.monotonic() + self.spec.metrics_interval_s

    def metrics_message(self) -> Outgoing:
        snap = self.stats.snapshot(self.spec.name)
        return Outgoing(self.settings.topics.metrics, self.spec.name, encode(snap))

    async def _process(self, batch: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        outs: list[tuple[Outgoing, list[tuple[str, bytes]]]] = []
        commits: dict[TopicPartition, int] = {}
        n_in = 0
        seen = self.redelivered.seen if self.redelivered else None
        for tp, msgs in batch.items():
            n_in += len(msgs)
            src = f"{self.spec.name}|{tp.topic}:{tp.partition}:"
            for m in msgs:
                rec = _to_record(m)
                if seen is not None and seen(rec):
                    self.stats.skipped_redelivered += 1
                    continue
                headers = [(SRC_HEADER, (src + str(m.offset)).encode())]
                answer = await self._answer_async(rec) if self._async else self._answer(rec)
                for out in answer:
                    outs.append((out, headers))
            commits[tp] = msgs[-1].offset + 1
        await self.producer.publish(outs)  # published and acknowledged ...
        await self.consumer.commit(commits)  # ... before the inputs count as done
        self.stats.consumed += n_in
        self.stats.published += len(outs)
        self.stats.batches += 1
        MESSAGES.labels(self.spec.name, "consumed").inc(n_in)
        MESSAGES.labels(self.spec.name, "published").inc(len(outs))

    def _answer(self, rec: Record) -> Sequence[Outgoing]:
        try:
            _refuse_oversized(rec)
            return self.spec.handle(rec)  # type: ignore[return-value]
        except Exception as exc:
            return self._refuse(rec, exc)

    async def _answer_async(self, rec: Record) -> Sequence[Outgoing]:
        try:
            _refuse_oversized(rec)
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
