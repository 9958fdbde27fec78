"""Arrival service: `jobs.submit` → `jobs.accepted` | `jobs.rejected`.

Also reads `cluster.nodes` (the inventory that decides whether a job could ever
fit) and `jobs.events` (a finished job's id may be submitted again). Bad
messages on those two are counted and ignored here: the telemetry service owns
their dead-letter topics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from services.arrival.admission import Admission
from shared.bus import Outgoing, Record, ServiceSpec, ServiceStats, serve_service
from shared.config import BusSettings
from shared.messages import JobEvent, NodeStatus

__all__ = ["ArrivalHandler", "serve", "service_spec"]

NAME = "arrival"
_ENDED = frozenset({"finished", "failed"})


class ArrivalHandler:
    """Routes each record to the admission logic by topic."""

    def __init__(self, settings: BusSettings, stats: ServiceStats) -> None:
        t = settings.topics
        self.topics = t
        self.admission = Admission()
        self.stats = stats
        self._node_dec = msgspec.json.Decoder(NodeStatus)
        self._event_dec = msgspec.json.Decoder(JobEvent)
        self._accepted_topic = t.jobs_accepted
        self._routes = {
            t.jobs_submit: self._submit,
            t.cluster_nodes: self._node,
            t.jobs_events: self._event,
        }

    def __call__(self, rec: Record) -> Sequence[Outgoing]:
        return self._routes[rec.topic](rec)

    def _submit(self, rec: Record) -> Sequence[Outgoing]:
        job_id, job = self.admission.admit_bytes(rec.value, rec.timestamp_ms / 1000.0)
        self.stats.extra["accepted"] += 1
        return [Outgoing(self._accepted_topic, job_id, job)]

    def _node(self, rec: Record) -> Sequence[Outgoing]:
        try:
            self.admission.inventory.update(self._node_dec.decode(rec.value or b""))
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_node_status"] += 1
        return ()

    def _event(self, rec: Record) -> Sequence[Outgoing]:
        self._apply_event(rec)
        return ()

    def _apply_event(self, rec: Record) -> None:
        try:
            ev = self._event_dec.decode(rec.value or b"")
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_event"] += 1
            return
        if ev.kind in _ENDED:
            self.admission.ended(ev.job_id, rec.source)

    def replay(self, rec: Record) -> None:
        """Rebuild the live-job set from what was accepted and what ended before a restart."""
        if rec.topic == self.topics.jobs_accepted and rec.key:
            self.admission.accepted(rec.key.decode("utf-8", "replace"))
        elif rec.topic == self.topics.jobs_events:
            self._apply_event(rec)


def service_spec(settings: BusSettings, stats: ServiceStats) -> ServiceSpec:
    t = settings.topics
    handler = ArrivalHandler(settings, stats)
    return ServiceSpec(
        name=NAME,
        topics=[t.jobs_submit, t.cluster_nodes, t.jobs_events],
        handle=handler,
        replay_topics=[t.jobs_accepted, t.jobs_rejected, t.jobs_events],
        replay=handler.replay,
    )


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
) -> ServiceStats:
    return await serve_service(settings, service_spec, stop, ready, group_id)
