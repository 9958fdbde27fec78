"""What goes on and comes off the bus, below the service loop of `shared.bus`:
records, the producer, reading topics back, dead letters and the source header.

Sizes follow Apache Kafka's defaults, not the embedded broker's (which takes
anything): a broker refuses a record batch over `message.max.bytes` (1,048,588
bytes by default), so the producer refuses anything over `MAX_REQUEST_BYTES`
itself, and a rejection is cut to at most `MAX_REJECTION_BYTES` once encoded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import zlib
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord

from shared.config import BusSettings
from shared.messages import Rejection, encode
from shared.reject import Reject

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_REJECTION_BYTES",
    "MAX_REQUEST_BYTES",
    "SRC_HEADER",
    "Outgoing",
    "Producer",
    "Record",
    "dead_letter",
    "fingerprint",
    "is_permanent",
    "partitions_of",
    "raw_text",
    "read_back",
    "read_to_end",
    "source_of",
    "to_record",
]

# On every output: "<service>|<topic>:<partition>:<offset>@<fingerprint>", the service
# that published it and the input it answers (one header, not two: it is paid for on
# every message). The fingerprint (the input's timestamp and a CRC of its key and value)
# tells an input from another one at the same offset of a topic deleted and recreated.
SRC_HEADER = "rltune-src"
MAX_MESSAGE_BYTES = 1 << 20  # an input larger than this is refused unread
MAX_REQUEST_BYTES = 1 << 20  # what Apache Kafka takes by default (message.max.bytes)
MAX_REJECTION_BYTES = 1 << 17  # a rejection, encoded, key included
RAW_KEEP_BYTES = 1 << 16  # at most this many bytes of the input in a rejection's raw
_MAX_REASON = 2000
_TOO_LARGE = "message of {} bytes exceeds 1 MiB"

# errors that the same message would meet again: retrying cannot help
_PERMANENT = (MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError)


def is_permanent(exc: BaseException) -> bool:
    """Whether publishing the same message again would fail the same way."""
    return isinstance(exc, _PERMANENT)


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


def fingerprint(rec: Record) -> str:
    """The input's timestamp and a CRC-32 of its key and value, in hex."""
    crc = zlib.crc32(rec.value or b"", zlib.crc32(rec.key or b""))
    return f"{rec.timestamp_ms & 0xFFFFFFFFFFFF:x}.{crc:08x}"


def source_of(service: str, rec: Record) -> bytes:
    """The SRC_HEADER value of an output of `service` that answers `rec`."""
    return f"{service}|{rec.topic}:{rec.partition}:{rec.offset}@{fingerprint(rec)}".encode()


def raw_text(value: bytes | None) -> str:
    """The bytes as received: UTF-8 text, else "base64:" + base64."""
    if value is None:
        return ""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode("ascii")


def dead_letter(settings: BusSettings, rec: Record, rej: Reject) -> Outgoing:
    """The dead-letter message for a record a handler refused, keyed by the job id the
    handler found, else by the input's own key.

    Bounded: `raw` holds the longest head of the input (at most RAW_KEEP_BYTES bytes)
    that keeps the encoded rejection within MAX_REJECTION_BYTES; when it is cut, the
    reason says how much of the input it holds. (Escaping can make a rejection six
    times the size of its raw bytes: every control byte becomes \\u00XX.)"""
    key: bytes | None = rej.key.encode() if rej.key else rec.key
    if key is not None and len(key) > MAX_REJECTION_BYTES // 4:
        key = key[: MAX_REJECTION_BYTES // 4]
    value = rec.value or b""
    reason = rej.reason if len(rej.reason) <= _MAX_REASON else rej.reason[:_MAX_REASON] + "..."
    budget = MAX_REJECTION_BYTES - (len(key) if key else 0)

    def build(n: int) -> bytes:
        head = value[:n]
        if n < len(value) and _is_utf8_head(head):  # cut at a character boundary:
            head = head.decode("utf-8", "ignore").encode()  # UTF-8 text stays text
        why = (
            reason
            if n >= len(value)
            else f"{reason} (raw holds its first {n} of {len(value)} bytes)"
        )
        msg = Rejection(
            job_id=rej.key,
            reason=why,
            raw=raw_text(head) if rec.value is not None else "",
            topic=rec.topic,
            time=max(rec.timestamp_ms, 0) / 1000.0,
        )
        return encode(msg)

    n = min(len(value), RAW_KEEP_BYTES)
    out = build(n)
    while len(out) > budget and n > 0:  # shrinks by the measured expansion; a few rounds
        n = max(0, min(n - 1, n * budget // len(out) - 64))
        out = build(n)
    return Outgoing(settings.topics.dead_letter(rec.topic), key, out)


def _is_utf8_head(head: bytes) -> bool:
    """Whether `head` is valid UTF-8 but for a character cut at its end."""
    try:
        head.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3 and exc.reason == "unexpected end of data"


def refuse_oversized(rec: Record) -> None:
    if rec.value is not None and len(rec.value) > MAX_MESSAGE_BYTES:
        raise Reject(_TOO_LARGE.format(len(rec.value)), kind="too_large")


def to_record(m: ConsumerRecord) -> Record:
    return Record(
        topic=m.topic,
        partition=m.partition,
        offset=m.offset,
        key=m.key,
        value=m.value,
        timestamp_ms=m.timestamp if m.timestamp is not None else 0,
        headers=tuple(m.headers or ()),
    )


Message = tuple[Outgoing, list[tuple[str, bytes]]]


class Producer:
    """An aiokafka producer with the project's settings, as an async context manager."""

    def __init__(self, settings: BusSettings, client_id: str = "rltune") -> None:
        self._p = AIOKafkaProducer(
            **settings.client_kwargs(),
            client_id=client_id,
            acks="all",
            linger_ms=2,
            max_batch_size=MAX_REQUEST_BYTES,
            max_request_size=MAX_REQUEST_BYTES,
            enable_idempotence=False,  # exactly-once effect comes from idempotent consumers
        )
        self._parts: dict[str, list[int]] = {}
        self._partitioner = DefaultPartitioner()

    async def start(self) -> None:
        await self._p.start()

    async def stop(self) -> None:
        await self._p.stop()

    async def __aenter__(self) -> Producer:
        try:
            await self._p.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await self._p.stop()
            raise
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

    async def publish(self, outs: Sequence[Message]) -> int:
        """`publish_each`, raising the first error if any message failed."""
        for err in await self.publish_each(outs):
            if err is not None:
                raise err
        return len(outs)

    async def publish_each(self, outs: Sequence[Message]) -> list[BaseException | None]:
        """Publish many messages in as few record batches as they fit in and wait for
        every ack; never raises for a broker error: the answer is, per message, None
        (acknowledged) or the error it met. Headers go as a list (aiokafka's batch
        builder takes no tuple). Keys choose partitions the way Kafka's default
        partitioner does (murmur2), so keyed order holds across clients."""
        errors: list[BaseException | None] = [None] * len(outs)
        waits: list[tuple[asyncio.Future[object], list[int]]] = []
        try:
            groups: dict[tuple[str, int], list[int]] = defaultdict(list)
            for i, (out, _) in enumerate(outs):
                parts = self._parts.get(out.topic) or await self._partitions(out.topic)
                groups[(out.topic, self._partition(parts, _key(out)))].append(i)
            for (topic, part), idx in groups.items():
                waits += await self._send_group(outs, topic, part, idx, errors)
        except (KafkaError, OSError) as exc:  # metadata or connection: nothing more went
            self._parts.clear()
            sent = {i for _, idx in waits for i in idx}
            for i in range(len(outs)):
                if i not in sent and errors[i] is None:
                    errors[i] = exc
        results = await asyncio.gather(*(f for f, _ in waits), return_exceptions=True)
        for res, (_, idx) in zip(results, waits, strict=True):
            if isinstance(res, BaseException):
                if isinstance(res, asyncio.CancelledError):
                    raise res
                self._parts.clear()  # the topic may have been recreated
                for i in idx:
                    errors[i] = res
        return errors

    async def _send_group(
        self,
        outs: Sequence[Message],
        topic: str,
        part: int,
        idx: list[int],
        errors: list[BaseException | None],
    ) -> list[tuple[asyncio.Future[object], list[int]]]:
        waits: list[tuple[asyncio.Future[object], list[int]]] = []
        batch, in_batch = self._p.create_batch(), []
        for i in idx:
            out, headers = outs[i]
            key = _key(out)
            size = _record_size(key, out.value, headers)
            if size > MAX_REQUEST_BYTES:  # a batch takes a first record of any size
                errors[i] = MessageSizeTooLargeError(
                    f"a record of about {size} bytes exceeds {MAX_REQUEST_BYTES} bytes"
                )
                continue
            if batch.append(key=key, value=out.value, timestamp=None, headers=headers) is not None:
                in_batch.append(i)
                continue
            if in_batch:
                waits.append((await self._p.send_batch(batch, topic, partition=part), in_batch))
                batch, in_batch = self._p.create_batch(), []
            batch.append(key=key, value=out.value, timestamp=None, headers=headers)
            in_batch.append(i)  # an empty batch takes any record
        if in_batch:
            waits.append((await self._p.send_batch(batch, topic, partition=part), in_batch))
        return waits

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


def _record_size(key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> int:
    """A record's size in a batch, within a few bytes, plus the batch header (61)."""
    head = sum(len(k) + len(v) + 10 for k, v in headers)
    return 61 + 20 + len(key or b"") + len(value) + head


def _key(out: Outgoing) -> bytes | None:
    return out.key.encode() if isinstance(out.key, str) else out.key


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
        **settings.client_kwargs(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
    )
    try:
        await c.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await c.stop()  # (a client that never connected still holds its resources)
        raise
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
                on_record(to_record(m))
    finally:
        await c.stop()
    return dict(seen)


async def partitions_of(consumer: AIOKafkaConsumer, topics: Sequence[str]) -> list[TopicPartition]:
    """Every partition of `topics` that exists (metadata refreshed first)."""
    await consumer.topics()
    return [
        TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or [])
    ]
