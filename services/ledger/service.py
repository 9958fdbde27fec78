"""Ledger service: each queue's decayed GPU-seconds as a faust-streaming table.

One faust agent consumes `jobs.accepted` and `jobs.events` (both keyed by job_id)
into two faust Tables: `jobs`, keyed by job_id (a job's queue, its GPUs, whether
they are counted now, and the offset of its last event applied), and `usage`,
keyed by queue, one `shared.fairshare.Row` per queue (decayed usage, as of, GPUs
held). Each has its changelog topic (`<prefix>ledger-jobs-changelog`,
`<prefix>ledger-usage-changelog`): after a restart faust reads the tables back from
the changelogs and the consumer resumes at its committed offsets, so `jobs.events`
is not read again from its start.

Partitions. A faust table writes a change to the changelog partition of the record
being processed; `usage` is keyed by queue, not by job, so the service counts on
the deployment's one partition per topic (k8s/topics.yaml, `ensure_topics`). With
several, the changes would first go through a topic keyed by queue (faust's
`group_by`); on the embedded broker that second agent stalled after a restart in
one of three runs (measured), so it is not done.

The decay and the factor are `shared.fairshare` (one implementation, the one the
simulator, scoring and telemetry keep in process). The changelog of `usage` is the
table as others see it: `rltune service scoring --ledger` reads it (the latest row
per queue) for drf's tie-break and the `fair_share` feature, instead of keeping the
usage itself from `jobs.events`.

On the embedded broker (Tansu), measured with tests/integration/test_ledger.py:
faust's group join waits out the rebalance timeout (30 s at faust's defaults, about
5 s with the 3 s set here); the group is sometimes joined twice after a restart,
and the second assignment reads again from the committed offset (those events are
recognised by offset and change nothing); topics are not compacted, so a restart
reads every changelog record back (one per table write), not one per key.

One record per producer batch (`producer_max_batch_size=1`: aiokafka always puts a
batch's first record in, and no second one fits). faust's recovery reads each
changelog up to the end the broker lists (ListOffsets, less one); the embedded
broker lists the first offset of the log's last record batch plus one, so with
several table writes in the last batch the restarted tables came back without the
rest of that batch (measured: 5 of 20 restarts with faust's 16 KiB batches, and
256-byte batches still hold two rows). With one record per batch that answer is the
end of the log; on Apache Kafka it is anyway, and the cost is only batching (one or
two changelog writes per input event).

Every record, by construction. faust-streaming 0.15.3 can drop an input record
after a restart and commit past it: at the end of table recovery it seeks the
inputs to their committed offsets while the fetcher already hands records to the
agent's queue, then resumes flow control, which clears that queue; the fetcher's
read offset is past the dropped record, and `_new_offset` commits over a single
missing offset (faust-streaming #596, #606; the evidence in
docs/design/fair-share.md). So the ledger keeps its own progress: the `jobs` row
`@next <topic> <partition>` (`_next_key`) holds the next offset of each input
partition to apply, written after each record's changes, and `Ledger` applies
every record before it has been applied. A record past that offset makes the
agent read the missing range itself (`_read_range`: a plain consumer assigned to
the partition, no group) and apply it first, in order; when nothing follows a
dropped record, the serve loop, once the agent has read nothing for `IDLE_S`,
sees the partition's end beyond that offset (twice, a turn apart) and does the
same. A range read that
returns nothing (transaction markers, compacted records) is done. The tables take
`use_partitioner` so the repair may write between records (one partition: the
same partition 0). Repairs count as `gap_records_applied` in the stats and
`rltune_ledger_gap_records_total{topic}`; failed reads (retried on the next
record or the next idle turn) as `gap_repair_errors`.

Idempotent by record: the `jobs` row keeps the offset of the last `jobs.events`
record applied to it, and an accepted job's row its queue, so a record read again
(faust reads from the committed offset after its seek, or the repair read it
first) changes nothing.

Deployed as `rltune service ledger` (compose, k8s) with the login every service
makes (`credentials`: faust's `broker_credentials` from `KafkaSecurity`), as the
principal `rltune-ledger` (shared/acl.py): it reads `jobs.accepted` and
`jobs.events` and owns faust's own topics (`shared.fairshare.ledger_topics`: the
changelogs and the leader assignor's topic, named after the app id
`<prefix>ledger`), which faust creates with compaction on for the changelogs. The app id is also the
consumer group; `--group-id` renames both, and its topics are then outside the
ACLs.

A start counts from the start event's time, a stop (finished, failed, preempted,
cancelled after a start) at its time. A start whose accepted record is not in yet
waits for it in the `jobs` row; a message that does not decode is counted and
skipped (telemetry dead-letters `jobs.events`, arrival validated `jobs.accepted`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import faust
import msgspec
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from faust.types import TP
from faust.types.auth import CredentialsT
from prometheus_client import Counter

from shared.bus import ServiceStats
from shared.cluster import ClusterSpec, load_cluster
from shared.config import BusSettings, KafkaSecurity
from shared.fairshare import (
    DEFAULT_HALF_LIFE_S,
    Row,
    queue_key,
    row_from_changelog,
    usage_changelog,
)
from shared.health import BROKER, HEALTH, ServiceHealth
from shared.messages import Job, JobEvent
from shared.wire import partitions_of, read_to_end

__all__ = [
    "LedgerSettings",
    "add_args",
    "build_app",
    "credentials",
    "from_args",
    "read_usage",
    "serve",
]

NAME = "ledger"
log = logging.getLogger("rltune.ledger")
STOPS = ("finished", "failed", "preempted", "cancelled")
GAP_RECORDS = Counter(
    "rltune_ledger_gap_records_total",
    "Input records the ledger read and applied itself, its consumer never having delivered them",
    ["topic"],
)
REPAIR_ERRORS = Counter(
    "rltune_ledger_repair_errors_total", "Reads of skipped input records that failed (retried)"
)


@dataclass(frozen=True)
class LedgerSettings:
    cluster: str | None = None  # queues and half-life; None: each VC a queue, 7 days
    datadir: str | None = None  # faust's local folder (None: a temporary one)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default=None, help="cluster spec (queues, fair_share.half_life_h)")


def from_args(args: argparse.Namespace) -> LedgerSettings:
    if args.cluster is not None:
        load_cluster(args.cluster)  # a bad file: one line and exit 2, before connecting
    return LedgerSettings(args.cluster)


def _broker_url(settings: BusSettings) -> str:
    return ";".join(f"kafka://{h}" for h in settings.bootstrap.split(","))


def credentials(security: KafkaSecurity) -> CredentialsT | None:
    """faust's `broker_credentials` for the login every other service makes
    (`KafkaSecurity.client_kwargs`): SASL (SCRAM or PLAIN, with TLS under SASL_SSL),
    TLS alone, or none for PLAINTEXT. faust hands them to its consumer, producer and
    the client that creates its topics."""
    kw = security.client_kwargs()
    if not kw:
        return None
    if security.protocol.startswith("SASL"):
        return faust.SASLCredentials(
            username=security.username,
            password=security.password,
            ssl_context=kw.get("ssl_context"),
            mechanism=security.mechanism,
        )
    return faust.SSLCredentials(kw["ssl_context"])


def build_app(
    settings: BusSettings,
    cluster: ClusterSpec | None,
    stats: ServiceStats,
    datadir: str,
    group_id: str | None = None,
) -> faust.App:
    """The faust app: one agent, two tables (module docstring); `app.ledger` is the
    `Ledger` that applies the records (the agent's and the repair's)."""
    t = settings.topics
    app = faust.App(
        group_id or f"{settings.topic_prefix}{NAME}",
        broker=_broker_url(settings),
        broker_credentials=credentials(settings.security),
        store="memory://",
        datadir=datadir,
        web_enabled=False,
        topic_partitions=1,
        topic_replication_factor=1,
        producer_acks=-1,
        producer_max_batch_size=1,  # one record per batch: module docstring
        broker_commit_every=100,
        broker_commit_interval=0.5,
        table_cleanup_interval=3600.0,
        consumer_auto_offset_reset="earliest",
        # the group join waits the rebalance timeout out on the embedded broker (Tansu):
        # 30 s at faust's defaults (measured), a few here
        broker_rebalance_timeout=3.0,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        key_serializer="json",
        value_serializer="json",
    )
    inputs = app.topic(t.jobs_accepted, t.jobs_events, key_serializer="raw", value_serializer="raw")
    # use_partitioner: a change's changelog partition comes from its key, not from the
    # record being processed, so that the repair may write between records (one
    # partition per topic: partition 0 either way)
    jobs = app.Table("jobs", default=lambda: None, use_partitioner=True)
    usage = app.Table("usage", default=lambda: None, use_partitioner=True)
    ledger = Ledger(settings, cluster, stats, jobs, usage)

    @app.agent(inputs)
    async def track(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            stats.consumed += 1
            stats.extra[f"read_{msg.topic}"] += 1
            first = f"first_offset_{msg.topic}"
            if first not in stats.extra:
                stats.extra[first] = msg.offset
            await ledger.record(msg.topic, msg.partition, msg.offset, event.value)

    app.ledger = ledger  # type: ignore[attr-defined]
    return app


def _next_key(topic: str, partition: int) -> str:
    """The `jobs` row holding the next offset to apply of an input partition: "@" and
    " " are outside JOB_ID_PATTERN, so no job's row has this key."""
    return f"@next {topic} {partition}"


def _job_key(job_id: str) -> None:
    """A job's `jobs` row is keyed by its id; the rows of the ledger's own (`_next_key`)
    start with "@", which no job id does (JOB_ID_PATTERN): a message that says
    otherwise is refused like any that does not decode."""
    if job_id.startswith("@"):
        raise msgspec.ValidationError(f"not a job id: {job_id!r}")


class Ledger:
    """Applies input records to the tables, each once, in offset order per partition,
    with none missing (module docstring: "Every record, by construction")."""

    def __init__(
        self,
        settings: BusSettings,
        cluster: ClusterSpec | None,
        stats: ServiceStats,
        jobs: Any,
        usage: Any,
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.half_life = cluster.half_life_s if cluster is not None else DEFAULT_HALF_LIFE_S
        self.stats = stats
        self.jobs = jobs
        self.usage = usage
        self.lock = asyncio.Lock()  # one applier at a time: the agent or the repair
        self.last_record = time.monotonic()
        self._reader: AIOKafkaConsumer | None = None
        self._behind: dict[tuple[str, int], int] = {}  # the idle repair's last look
        self._job_dec = msgspec.json.Decoder(Job)
        self._ev_dec = msgspec.json.Decoder(JobEvent)

    def next_offset(self, topic: str, partition: int) -> int | None:
        """The next offset of `topic`/`partition` to apply: every one before it has
        been applied (None: none recorded yet)."""
        got = self.jobs[_next_key(topic, partition)]
        return None if got is None else int(got)

    async def record(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        """A record the agent read: first every record before it that was never
        applied (read here, from the broker), then the record itself."""
        async with self.lock:
            self.last_record = time.monotonic()
            try:
                await self._catch_up(topic, partition, offset)
            except Exception as exc:  # the broker: the idle repair reads it all again
                log.warning(
                    "ledger: reading %s/%d before %d failed: %r", topic, partition, offset, exc
                )
                self.stats.extra["gap_repair_errors"] += 1
                REPAIR_ERRORS.inc()
                return  # its offset stays unapplied, so the repair reads this one too
            self._apply(topic, offset, value)
            self._advance(topic, partition, offset + 1)
            self.last_record = time.monotonic()

    async def repair_idle(
        self, tps: list[tuple[str, int]], idle_s: float, fetched: dict[tuple[str, int], int]
    ) -> None:
        """While the agent has read nothing for `idle_s`, any record of `tps` before
        the partition's end that was never applied (no later record will show the
        gap to the agent) is read here and applied. The end is the larger of
        ListOffsets' answer and the high watermark of the app's own last fetch
        (`fetched`; the embedded broker lists the first offset of the last batch
        plus one, `shared.wire.read_to_end`)."""
        if time.monotonic() - self.last_record < idle_s:
            self._behind.clear()
            return
        async with self.lock:
            for topic, partition in tps:
                c = await self._client()
                tp = TopicPartition(topic, partition)
                end = max((await c.end_offsets([tp]))[tp], fetched.get((topic, partition), 0))
                nxt = self.next_offset(topic, partition) or 0
                # behind at two turns in a row with nothing read between: not a record
                # that arrived just now and is on its way to the agent
                seen, self._behind[topic, partition] = self._behind.get((topic, partition)), nxt
                if end > nxt and seen == nxt:
                    await self._catch_up(topic, partition, end)
                elif end <= nxt:
                    del self._behind[topic, partition]

    async def close(self) -> None:
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None

    async def _catch_up(self, topic: str, partition: int, upto: int) -> None:
        """Read and apply every record of the partition from the next offset to apply
        up to `upto` (excluded), in order, advancing the next offset as they go."""
        start = self.next_offset(topic, partition)
        if start is not None and upto <= start:
            return  # the usual case: nothing missing
        c = await self._client()
        tp = TopicPartition(topic, partition)
        if start is None:  # nothing recorded (a new ledger): from the start of the log
            start = (await c.beginning_offsets([tp]))[tp]
        if upto <= start:
            return
        async for batch in _read_range(c, tp, start, upto):
            for rec in batch:
                self._apply(topic, rec.offset, rec.value)
                self._advance(topic, partition, rec.offset + 1)
                self.stats.extra["gap_records_applied"] += 1
                GAP_RECORDS.labels(topic).inc()
                log.info(
                    "ledger: %s/%d offset %d applied, never read", topic, partition, rec.offset
                )
        # the rest of the range held no record (control batches, compacted away): done
        self._advance(topic, partition, upto)

    def _advance(self, topic: str, partition: int, nxt: int) -> None:
        if nxt > (self.next_offset(topic, partition) or 0):
            self.jobs[_next_key(topic, partition)] = nxt

    async def _client(self) -> AIOKafkaConsumer:
        if self._reader is None:
            c = AIOKafkaConsumer(
                **self.settings.client_kwargs(),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
            )
            await c.start()
            self._reader = c
        return self._reader

    def _apply(self, topic: str, offset: int, value: bytes | None) -> None:
        """One input record: its job's row and its queue's usage (idempotent by
        offset: a record applied already changes nothing)."""
        stats = self.stats
        try:
            if topic == self.settings.topics.jobs_accepted:
                job = self._job_dec.decode(value or b"")
                _job_key(job.job_id)
                out = _accepted(self.jobs, job, self.cluster)
            else:
                ev = self._ev_dec.decode(value or b"")
                _job_key(ev.job_id)
                got = _event(self.jobs, ev, offset)
                if got is None:
                    stats.extra["duplicate_events"] += 1
                    return
                out = got
        except msgspec.MsgspecError:
            stats.extra["ignored_bad_message"] += 1
            return
        for queue, change in out:
            row = self.usage[queue]
            old = Row(row["usage"], row["as_of"], row["gpus"]) if row else Row(as_of=change["t"])
            new = old.change(change["t"], change["gpus"], self.half_life)
            self.usage[queue] = {"usage": new.usage, "as_of": new.as_of, "gpus": new.gpus}
            stats.extra["changes_applied"] += 1


def _accepted(jobs: Any, job: Job, cluster: ClusterSpec | None) -> list[tuple[str, dict]]:
    row = jobs[job.job_id] or {}
    if "queue" in row:
        return []  # a redelivery
    gpus = job.num_gpus * job.gpu_milli / 1000.0
    row = {**row, "queue": queue_key(cluster, job.vc), "gpus": gpus}
    out = []
    if row.get("pending") is not None:  # its start came first
        out.append((row["queue"], {"t": row.pop("pending"), "gpus": gpus}))
        row["counted"] = True
    jobs[job.job_id] = row
    return out


def _event(jobs: Any, ev: JobEvent, offset: int) -> list[tuple[str, dict]] | None:
    row = jobs[ev.job_id] or {}
    if row.get("offset", -1) >= offset:
        return None  # applied already: read again after a restart or a rebalance
    row = {**row, "offset": offset}
    out = []
    counted = row.get("counted", False)
    if ev.kind == "started" and not counted and row.get("pending") is None:
        if "queue" in row:
            out.append((row["queue"], {"t": ev.time, "gpus": row["gpus"]}))
            row["counted"] = True
        else:
            row["pending"] = ev.time
    elif ev.kind in STOPS:
        if counted:
            out.append((row["queue"], {"t": ev.time, "gpus": -row["gpus"]}))
        row["counted"] = False
        row["pending"] = None
    jobs[ev.job_id] = row
    return out


async def _read_range(
    c: AIOKafkaConsumer, tp: TopicPartition, start: int, stop: int, stall_s: float = 30.0
) -> AsyncIterator[list[ConsumerRecord]]:
    """The records of `tp` with offsets in [start, stop), a batch at a time, read with
    the plain consumer `c` (no group). The read ends when the position reaches `stop`:
    a range that holds no record moves the position past it all the same. A read
    that makes no progress for `stall_s` raises TimeoutError."""
    c.assign([tp])
    c.seek(tp, start)
    last, since = start, time.monotonic()
    while (pos := await c.position(tp)) < stop:
        if pos > last:
            last, since = pos, time.monotonic()
        elif time.monotonic() - since > stall_s:
            raise TimeoutError(f"{tp.topic}/{tp.partition} stayed at {pos} below {stop}")
        got = await c.getmany(tp, timeout_ms=500)
        batch = [r for r in got.get(tp, []) if start <= r.offset < stop]
        if batch:
            yield batch


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
    conf: LedgerSettings | None = None,
    stats: ServiceStats | None = None,
) -> ServiceStats:
    conf = conf or LedgerSettings()
    stop = stop or asyncio.Event()
    stats = stats or ServiceStats()
    cluster = load_cluster(conf.cluster) if conf.cluster else None
    with contextlib.ExitStack() as stack:
        datadir = conf.datadir or stack.enter_context(tempfile.TemporaryDirectory())
        app = build_app(settings, cluster, stats, datadir, group_id)
        app.finalize()
        ledger: Ledger = app.ledger  # type: ignore[attr-defined]
        inputs = {settings.topics.jobs_accepted, settings.topics.jobs_events}
        health = HEALTH[NAME] = ServiceHealth(NAME)
        await app.start()
        settled = False
        try:
            if ready is not None:
                ready.set()
            while not stop.is_set():
                _probe(app, health)
                settled = await _repair_when_idle(app, ledger, inputs, settled, stats)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            health.stopped = True
            if HEALTH.get(NAME) is health:
                del HEALTH[NAME]
            await app.stop()
            await ledger.close()
    return stats


IDLE_S = 3.0  # the agent read nothing this long: the idle repair looks at the ends


async def _repair_when_idle(
    app: faust.App, ledger: Ledger, inputs: set[str], settled: bool, stats: ServiceStats
) -> bool:
    """The idle repair (`Ledger.repair_idle`), only while the app is settled: tables
    recovered, no rebalance under way, the inputs assigned. Returns whether it is
    settled; the agent's idle time counts from when it became so."""
    assigned = [(tp.topic, tp.partition) for tp in app.consumer.assignment() if tp.topic in inputs]
    recovered = app.tables.recovery.completed.is_set()  # type: ignore[attr-defined]
    now_settled = recovered and not app.rebalancing and bool(assigned)
    if now_settled and not settled:
        ledger.last_record = max(ledger.last_record, time.monotonic())
    if now_settled:
        fetched = {}
        for topic, partition in assigned:
            with contextlib.suppress(Exception):  # none yet: ListOffsets alone
                fetched[topic, partition] = app.consumer.highwater(TP(topic, partition)) or 0
        try:
            await ledger.repair_idle(sorted(assigned), IDLE_S, fetched)
        except Exception as exc:  # the broker: again on the next tick
            log.warning("ledger: idle repair failed: %r", exc)
            stats.extra["gap_repair_errors"] += 1
            REPAIR_ERRORS.inc()
    return now_settled


def _probe(app: faust.App, health: ServiceHealth) -> None:
    """The probes (`rltune service ledger --prometheus-port`) from faust's state: live
    while the app has not crashed; ready once its consumer holds partitions, which
    it gets only through the broker (a group join answered)."""
    if app.crashed:
        return  # liveness fails after `live_after_s`: k8s restarts the pod
    health.turn()
    health.assigned = bool(app.consumer.assignment())
    if health.assigned:
        BROKER.ok()


async def read_usage(settings: BusSettings, timeout_s: float = 30.0) -> dict[str, Row]:
    """The `usage` table as its changelog holds it: the latest row per queue (what a
    compacted topic keeps), read from the start to the end as of now (`read_to_end`:
    the end is not only what ListOffsets answers, which on the embedded broker falls
    short of the log's end when the last batch holds several records)."""
    from aiokafka import AIOKafkaConsumer

    topic = usage_changelog(settings.topic_prefix)
    c = AIOKafkaConsumer(
        **settings.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await c.start()
    try:
        tps = await partitions_of(c, [topic])  # fresh metadata: faust made the topic
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        rows: dict[str, Row] = {}
        async with asyncio.timeout(timeout_s):
            async for batch in read_to_end(c, tps):
                for rec in batch:
                    got = row_from_changelog(rec.key, rec.value)
                    if got is not None:
                        rows[got[0]] = got[1]
        return rows
    finally:
        await c.stop()
