"""Telemetry service: every stream of a run → `metrics` (`MetricsSnapshot`) and
`rl.rewards` (`Reward`), every `interval_s`.

Consumes `jobs.accepted`, `jobs.events`, `cluster.nodes`, `sched.placements`,
`offload.stats`, `jobs.rejected` and the dead-letter topics; owns the dead
letters of `jobs.events`, `cluster.nodes` and `offload.stats` (a message there
that does not decode goes to `<topic>.dlq`, counted). The figures are
`services.telemetry.windows`. After a restart it reads its inputs back from the
beginning, then consumes from its committed offset: a record at or below the
offset read back in its partition was applied already and is skipped (a
preempted job's earlier `started`, applied again, would reopen the segment its
`preempted` closed: its run counted twice). Each record thus counts once per
process, read back or live, in the Prometheus histograms and counters as well.

Why no faust-streaming table: a faust windowed table aggregates per key on the
record's timestamp, with its own worker, changelog topics and commit policy.
These figures are percentiles over all jobs of a window of the *message* clock
(virtual time in simulation), joined from two topics (accepted × events), and
every service here shares one consume → publish → commit loop with dead-letter
handling (`shared.bus`); a second streaming framework beside it would duplicate
that loop for a state that fits in one dict per job.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from services.telemetry.prom import (
    FAIR_SHARE,
    GPU_UTIL,
    JCT,
    JOBS,
    OFFLOAD_HIT,
    OFFLOAD_MIGRATION,
    PREEMPTIONS,
    QUEUE_ALLOCATED,
    QUEUE_BORROWED,
    QUEUE_PENDING,
)
from services.telemetry.windows import JobState, Telemetry, preemption_reason
from shared import serving
from shared.bus import (
    Outgoing,
    Producer,
    Record,
    ServiceSpec,
    ServiceStats,
    Stopped,
    deliver,
)
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import Job, JobEvent, NodeStatus, OffloadStats, PlacementBatch, encode
from shared.prom import QUEUE_WAIT
from shared.reject import Reject

__all__ = ["TelemetrySettings", "add_args", "from_args", "serve"]

NAME = "telemetry"


@dataclass(frozen=True)
class TelemetrySettings:
    interval_s: float = 1.0  # wall seconds between snapshots
    window_s: float = 3600.0  # the sliding window, in the messages' clock
    cluster: str | None = None  # queues and half-life of the per-queue figures


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=1.0, help="seconds between snapshots")
    p.add_argument("--window", type=float, default=3600.0, help="sliding window (message clock)")
    p.add_argument(
        "--cluster", default=None, help="cluster spec: its queues, for the per-queue figures"
    )


def from_args(args: argparse.Namespace) -> TelemetrySettings:
    if args.interval <= 0 or args.window <= 0:
        raise UserError("--interval and --window must be positive")
    if args.cluster is not None:
        load_cluster(args.cluster)  # a bad file: one line and exit 2, before connecting
    return TelemetrySettings(args.interval, args.window, args.cluster)


class TelemetryHandler:
    def __init__(self, settings: BusSettings, stats: ServiceStats, conf: TelemetrySettings) -> None:
        t = settings.topics
        self.t = t
        self.stats = stats
        cluster = load_cluster(conf.cluster) if conf.cluster else None
        self.state = Telemetry(conf.window_s, cluster=cluster)
        self.state.on_event = self._observed
        self._job = msgspec.json.Decoder(Job)
        self._dec: dict[str, msgspec.json.Decoder[Any]] = {
            t.jobs_events: msgspec.json.Decoder(JobEvent),
            t.cluster_nodes: msgspec.json.Decoder(NodeStatus),
            t.offload_stats: msgspec.json.Decoder(OffloadStats),
        }
        self._placements = msgspec.json.Decoder(PlacementBatch)
        self.rejection_topics = {t.jobs_rejected, *(n for n in t.all() if n.endswith(".dlq"))}
        # the last offset read back per (topic, partition): consumed again, not applied
        self.read_back: dict[tuple[str, int], int] = {}

    def __call__(self, rec: Record) -> Sequence[Outgoing]:
        if rec.offset <= self.read_back.get((rec.topic, rec.partition), -1):
            self.stats.extra["skipped_read_back"] += 1
            dec = self._dec.get(rec.topic)  # applied already; a malformed one is still
            if dec is not None:  # dead-lettered (read back, it was passed over)
                try:
                    dec.decode(rec.value or b"")
                except msgspec.MsgspecError as exc:
                    raise Reject(f"invalid message on {rec.topic}: {exc}", kind="invalid") from None
            return ()
        self.apply(rec, strict=True)
        return ()

    def replay(self, rec: Record) -> None:
        """A record read back at start: applied, its offset noted."""
        key = (rec.topic, rec.partition)
        if rec.offset > self.read_back.get(key, -1):
            self.read_back[key] = rec.offset
        self.apply(rec, strict=False)

    def apply(self, rec: Record, strict: bool) -> None:
        t, s = self.t, self.state
        if rec.topic in self.rejection_topics:
            s.rejection(rec.topic, rec.source)
        elif rec.topic == t.jobs_accepted:
            with contextlib.suppress(msgspec.MsgspecError):
                s.accepted(self._job.decode(rec.value or b""))
        elif rec.topic == t.sched_placements:
            try:
                s.placement(self._placements.decode(rec.value or b""))
            except msgspec.MsgspecError:
                self.stats.extra["ignored_bad_placement"] += 1  # cluster_sim dead-letters it
        else:
            try:
                msg = self._dec[rec.topic].decode(rec.value or b"")
            except msgspec.MsgspecError as exc:
                if strict:
                    raise Reject(f"invalid message on {rec.topic}: {exc}", kind="invalid") from None
                return
            if isinstance(msg, JobEvent):
                s.event(msg)
            elif isinstance(msg, NodeStatus):
                s.node(msg)
            else:
                s.offload_stats(msg)

    def _observed(
        self, js: JobState, ev: JobEvent, before: tuple[float | None, bool, bool]
    ) -> None:
        """The state's `on_event`: each event of a known job once (read back or live;
        one read before its job's accepted record when the job is accepted) into the
        Prometheus histograms and the preemption counter."""
        _observe(js.job, ev, before, js.done)
        if ev.kind == "preempted" and before[0] is not None:
            PREEMPTIONS.labels(self.state.queue_of(js.job), preemption_reason(ev.detail)).inc()


def _observe(job: Job, ev: JobEvent, before: tuple[float | None, bool, bool], done: bool) -> None:
    """Queueing delay at a job's first start (not at a restart after a preemption: it
    had a segment), JCT at its end (Prometheus histograms). `before`: the job's open
    start, whether it was done, whether it had run a segment, before the event."""
    queue = job.vc or "default"
    if ev.kind == "started" and before[0] is None and not before[1] and not before[2]:
        QUEUE_WAIT.labels(queue).observe(max(ev.time - job.submit_time, 0.0))
    elif done and not before[1]:
        JCT.labels(queue).observe(max(ev.time - job.submit_time, 0.0))


def export(s: Telemetry) -> None:
    """The run's figures as Prometheus gauges (scraped from this service)."""
    c = s.counters()
    for state in ("ahead", "waiting", "running", "done", "failed"):
        JOBS.labels(state).set(c[state])
    for t, u in s.util_by_type().items():
        GPU_UTIL.labels(t).set(u)
    for q, row in s.queues().items():
        QUEUE_PENDING.labels(q).set(row["pending_jobs"])
        QUEUE_ALLOCATED.labels(q, "all").set(row["allocated_gpus"])
        for key, v in row.items():
            if key.startswith("allocated_gpus."):
                QUEUE_ALLOCATED.labels(q, key.split(".", 1)[1]).set(v)
        if "borrowed_gpus" in row:
            QUEUE_BORROWED.labels(q).set(row["borrowed_gpus"])
        FAIR_SHARE.labels(q).set(row["fair_share"])
    if "offload_hit_rate" in c:
        OFFLOAD_HIT.set(c["offload_hit_rate"])
        OFFLOAD_MIGRATION.labels("50").set(c["offload_migration_ms_p50"] / 1e3)
        OFFLOAD_MIGRATION.labels("99").set(c["offload_migration_ms_p99"] / 1e3)


async def _publisher(
    settings: BusSettings,
    handler: TelemetryHandler,
    conf: TelemetrySettings,
    stop: asyncio.Event,
    built: asyncio.Event,
    stats: ServiceStats,
) -> None:
    """Snapshots and rewards every `interval_s`, once the state is rebuilt from the
    topics (`built`): before that the windows are empty, and a snapshot of zeros or
    a reward over no jobs would be taken for the run's. Every publish goes through
    the bus's retry loop, so an outage is waited out, not fatal."""
    t = settings.topics
    window = f"last:{conf.window_s:g}s"
    async with Producer(settings, client_id=f"{NAME}-snapshots") as producer:
        with contextlib.suppress(Stopped):  # stopped while waiting for the broker
            await _until_either(built, stop)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), conf.interval_s)
                s = handler.state
                now = time.time()
                export(s)
                snaps = [s.snapshot(now), s.snapshot(now, window)]
                reward = s.reward()
                outs = [Outgoing(t.metrics, snap.source, encode(snap)) for snap in snaps]
                outs.append(Outgoing(t.rl_rewards, reward.window, encode(reward)))
                stats.published += await deliver(
                    producer, outs, stop, NAME, lambda o: (o, []), stats=stats
                )


async def _until_either(first: asyncio.Event, second: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
    conf: TelemetrySettings | None = None,
) -> ServiceStats:
    conf = conf or TelemetrySettings()
    stats = ServiceStats()
    handler = TelemetryHandler(settings, stats, conf)
    t = settings.topics
    inputs = [
        t.jobs_accepted, t.jobs_events, t.cluster_nodes, t.sched_placements, t.offload_stats,
        *sorted(handler.rejection_topics),
    ]  # fmt: skip
    spec = ServiceSpec(
        name=NAME,
        topics=inputs,
        handle=handler,
        replay_topics=inputs,
        replay=handler.replay,
    )

    async def publisher(s: serving.Serving) -> None:
        await _publisher(settings, handler, conf, s.stop, s.built, stats)

    return await serving.serve(
        settings, spec, stop, ready, group_id, stats=stats, beside=[publisher]
    )
