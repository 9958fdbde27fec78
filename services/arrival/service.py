"""Arrival service: `jobs.submit` → `jobs.accepted` | `jobs.rejected`.

Also reads `cluster.nodes` (the inventory that decides whether a job could ever
fit) and `jobs.events` (a finished job's id may be submitted again). Bad
messages on those two are counted and ignored here: the telemetry service owns
their dead-letter topics.

Users' jobs during a trace replay (`--user-jobs`): a simulated cluster runs only
the jobs of the trace it replays (their run times are its own), so a job a user
publishes meanwhile would be accepted and then never run. A replay marks its
specs (`shared.replay.REPLAY_HEADERS`); any other valid spec is then refused at
once on `jobs.rejected`, with a reason that says why and what to run instead:
always under `reject` (what `rltune up --trace` runs), never under `run`, and
under `auto` (the default) once this service has seen a replayed spec.

With `--cluster FILE` a job's `priority_class` must name one of the file's
`priority_classes` (else `jobs.rejected`, the reason naming the field).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from services.arrival.admission import Admission, decode_spec
from shared import serving
from shared.bus import Outgoing, Record, ServiceSpec, ServiceStats
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.messages import JobEvent, NodeStatus
from shared.reject import Reject
from shared.replay import ORIGIN_HEADER, REPLAY_ORIGIN

__all__ = ["ArrivalHandler", "ArrivalSettings", "add_args", "from_args", "serve", "service_spec"]

NAME = "arrival"
_ENDED = frozenset({"finished", "failed", "cancelled"})
USER_JOBS = ("auto", "run", "reject")
NOT_RUN_IN_REPLAY = (
    "job {job_id} is not run: this deployment replays a trace on a simulated cluster, which "
    "runs only the trace's own jobs (it has no host to run a command on, and no run time "
    "for a job that is not in the trace). To run your own jobs, start `rltune up` without "
    "--trace (a local cluster that runs each job's command), or compose without its replay "
    "overlay"
)


@dataclass(frozen=True)
class ArrivalSettings:
    user_jobs: str = "auto"  # users' jobs beside a replay: see the module docstring
    cluster: str | None = None  # its priority classes are the ones a job may name


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--user-jobs",
        default="auto",
        choices=USER_JOBS,
        help="jobs not marked as a replay's: refuse them (reject), accept them (run), or "
        "refuse them once a replayed job has been seen (auto, the default)",
    )

    p.add_argument(
        "--cluster",
        default=None,
        help="cluster file: a job's priority_class must be one of its priority_classes",
    )


def from_args(args: argparse.Namespace) -> ArrivalSettings:
    if args.cluster is not None:
        load_cluster(args.cluster)  # a bad file: one line and exit 2, before connecting
    return ArrivalSettings(args.user_jobs, args.cluster)


class ArrivalHandler:
    """Routes each record to the admission logic by topic."""

    def __init__(
        self, settings: BusSettings, stats: ServiceStats, conf: ArrivalSettings | None = None
    ) -> None:
        t = settings.topics
        self.conf = conf or ArrivalSettings()
        self.replaying = self.conf.user_jobs == "reject"  # refuse users' jobs now
        self.topics = t
        classes = None
        if self.conf.cluster is not None:
            classes = list(load_cluster(self.conf.cluster).priority_classes)
        self.admission = Admission(classes)
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
        if rec.header(ORIGIN_HEADER) == REPLAY_ORIGIN:
            self.replaying = self.replaying or self.conf.user_jobs == "auto"
        elif self.replaying:
            spec = decode_spec(rec.value)  # a malformed spec: the reason names its field
            self.stats.extra["user_jobs_refused_in_replay"] += 1
            raise Reject(
                NOT_RUN_IN_REPLAY.format(job_id=spec.job_id), key=spec.job_id, kind="replay_only"
            )
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
        """Rebuild the live-job set from what was accepted and what ended before a restart,
        and the inventory from every node's statuses (a restart that knew only the
        nodes reporting after it would refuse jobs the whole cluster can hold)."""
        if rec.topic == self.topics.jobs_accepted and rec.key:
            self.admission.accepted(rec.key.decode("utf-8", "replace"))
        elif rec.topic == self.topics.jobs_events:
            self._apply_event(rec)
        elif rec.topic == self.topics.cluster_nodes:
            self._node(rec)


def service_spec(
    settings: BusSettings, stats: ServiceStats, conf: ArrivalSettings | None = None
) -> ServiceSpec:
    t = settings.topics
    handler = ArrivalHandler(settings, stats, conf)
    return ServiceSpec(
        name=NAME,
        topics=[t.jobs_submit, t.cluster_nodes, t.jobs_events],
        handle=handler,
        replay_topics=[t.jobs_accepted, t.jobs_rejected, t.jobs_events, t.cluster_nodes],
        replay=handler.replay,
    )


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
    conf: ArrivalSettings | None = None,
) -> ServiceStats:
    spec = functools.partial(service_spec, conf=conf)
    return await serving.serve(settings, spec, stop, ready, group_id)
