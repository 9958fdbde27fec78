"""Placement service: `sched.priorities` (+ `sched.rounds`) → `sched.placements`.

With `--placer NAME+offload+replace` (and `--cluster`) a batch of a free round may
also carry `moves`: running offloading jobs to checkpoint and restart elsewhere
(services/placement/moves.py), at most one per round; a driven executor (cluster_sim)
asks for them in `replace` requests of its own, each answered with at most one move
(services/placement/rounds.py).

Consumes `jobs.accepted`, `cluster.nodes`, `jobs.events`, `sched.priorities`
(it owns that topic's dead letters) and `sched.rounds`; keeps its own view of
the free GPUs (`services.placement.view`) and solves with the placer by name
(`--placer`, MILP by default). Live, every solve is bounded by wall time (the
placer's own time limit); with `--reproducible` (lockstep) the MILP stops on
CP-SAT's deterministic time instead, so an answer depends only on its inputs.
After a restart the view and the jobs are rebuilt from the topics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from services.placement.registry import OFFLOAD_SUFFIX, make_placer
from services.placement.rounds import PlacementState
from shared import serving
from shared.bus import Outgoing, Record, ServiceSpec, ServiceStats
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import (
    Job,
    JobEvent,
    NodeStatus,
    PlacementBatch,
    PriorityBatch,
    RoundRequest,
    encode,
)
from shared.placement_api import DISCIPLINES
from shared.prom import SOLVE_SECONDS
from shared.reject import Reject
from shared.sched.ordered import OrderedPlacer

__all__ = ["PlacementSettings", "add_args", "from_args", "serve"]

NAME = "placement"


@dataclass(frozen=True)
class PlacementSettings:
    placer: str = "milp"
    cluster: str | None = None
    reproducible: bool = False
    discipline: str = "easy"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--placer",
        default="milp",
        help="milp (default), greedy, first-fit, ...; NAME+offload and NAME+offload+replace "
        "(moves) need --cluster",
    )
    p.add_argument("--cluster", default=None, help="cluster spec (default: nodes as they report)")
    p.add_argument(
        "--discipline",
        default="easy",
        choices=DISCIPLINES,
        help="what a job that cannot start does to those behind it (default easy)",
    )
    p.add_argument(
        "--reproducible",
        action="store_true",
        help="stop the MILP on deterministic time, not wall time (lockstep)",
    )


def from_args(args: argparse.Namespace) -> PlacementSettings:
    make_placer(args.placer)  # a bad name is one line and exit 2, before connecting
    if OFFLOAD_SUFFIX in args.placer and not args.cluster:
        raise UserError(
            f"--placer {args.placer} needs --cluster: its offload cost model reads the "
            "nodes' PCIe and NVMe GB/s and host memory from the cluster spec"
        )
    return PlacementSettings(args.placer, args.cluster, args.reproducible, args.discipline)


class PlacementHandler:
    def __init__(self, settings: BusSettings, stats: ServiceStats, conf: PlacementSettings) -> None:
        self.t = settings.topics
        self.stats = stats
        cluster = load_cluster(conf.cluster) if conf.cluster else None
        placer = OrderedPlacer(make_placer(conf.placer, conf.reproducible), conf.discipline)
        self.state = PlacementState(placer, cluster)
        self._job = msgspec.json.Decoder(Job)
        self._event = msgspec.json.Decoder(JobEvent)
        self._node = msgspec.json.Decoder(NodeStatus)
        self._round = msgspec.json.Decoder(RoundRequest)
        self._prio = msgspec.json.Decoder(PriorityBatch)
        self._routes = {
            self.t.jobs_accepted: self._accepted,
            self.t.jobs_events: self._events,
            self.t.cluster_nodes: self._nodes,
            self.t.sched_rounds: self._rounds,
            self.t.sched_priorities: self._priorities,
        }
        self._replayed_places: list[RoundRequest] | None = []
        self._replayed_answers: set[int] = set()
        # read back: our own answers, and the round ids that were asked (round requests,
        # priority batches); an "answer" on sched.placements to no asked round is not
        # ours, and is not taken as what was placed
        self._replayed_batches: list[PlacementBatch] = []
        self._asked_ids: set[int] = set()

    def __call__(self, rec: Record) -> Sequence[Outgoing]:
        if self._replayed_places is not None:  # after a restart: what was asked, not answered
            self._take_replayed_answers()
            for req in self._replayed_places:
                if req.round_id not in self._replayed_answers:
                    self.state.request(req)
            self._replayed_places = None
        batches = self._routes[rec.topic](rec)
        batches += self.state.answer_rounds()
        for b in batches:
            SOLVE_SECONDS.observe(b.solver_ms / 1e3)
        self.stats.extra["rounds"] = self.state.counts["rounds"]
        self.stats.extra["rejected_placement"] = self.state.counts["rejected_placement"]
        if self.state.offload is not None:
            self.stats.extra["moves"] = self.state.counts["moves"]
        if self.state.solve_ms:
            self.stats.extra["last_solve_ms"] = round(self.state.solve_ms[-1])
        return [Outgoing(self.t.sched_placements, str(b.round_id), encode(b)) for b in batches]

    def _accepted(self, rec: Record) -> list[PlacementBatch]:
        try:
            self.state.accepted(self._job.decode(rec.value or b""))
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_job"] += 1
        return []

    def _events(self, rec: Record) -> list[PlacementBatch]:
        try:
            self.state.event(self._event.decode(rec.value or b""))
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_event"] += 1  # telemetry dead-letters it
        return []

    def _nodes(self, rec: Record) -> list[PlacementBatch]:
        try:
            self.state.node(self._node.decode(rec.value or b""))
        except (msgspec.MsgspecError, ValueError):
            self.stats.extra["ignored_bad_node_status"] += 1  # telemetry dead-letters it
        return []

    def _rounds(self, rec: Record) -> list[PlacementBatch]:
        try:
            self.state.request(self._round.decode(rec.value or b""))
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_round"] += 1  # scoring dead-letters it
        return []

    def _priorities(self, rec: Record) -> list[PlacementBatch]:
        try:
            batch = self._prio.decode(rec.value or b"")
        except msgspec.MsgspecError as exc:
            raise Reject(f"invalid PriorityBatch: {exc}", kind="invalid") from None
        if batch.driven:
            return []  # the executor names this round's window (sched.rounds, phase place)
        return [self.state.free_round(batch.round_id, batch.time, batch.jobs)]

    def _take_replayed_answers(self) -> None:
        """Once read back: a batch on sched.placements for a round nobody asked (no round
        request, no priority batch names it) is not ours: what it placed is taken back
        (unless an answer of ours placed the same job) and it is counted."""
        ours = [b for b in self._replayed_batches if b.round_id in self._asked_ids]
        kept = {a.job_id for b in ours for a in b.assignments}
        for b in self._replayed_batches:
            if b.round_id in self._asked_ids:
                continue
            self.stats.extra["answers_never_asked"] += 1
            self._replayed_answers.discard(b.round_id)
            for a in b.assignments:
                if a.job_id not in kept:
                    self.state.placed.discard(a.job_id)
        self._replayed_batches = []

    def replay(self, rec: Record) -> None:
        """Read back at start: the jobs, the latest state of every node, what started."""
        if rec.topic == self.t.sched_placements:
            with contextlib.suppress(msgspec.MsgspecError):
                b = msgspec.json.decode(rec.value or b"", type=PlacementBatch)
                self._replayed_batches.append(b)  # checked once read back
                self._replayed_answers.add(b.round_id)
                for a in b.assignments:
                    if a.job_id not in self.state.gone:
                        self.state.placed.add(a.job_id)
        elif rec.topic == self.t.sched_priorities:
            with contextlib.suppress(msgspec.MsgspecError):
                self._asked_ids.add(self._prio.decode(rec.value or b"").round_id)
        elif rec.topic == self.t.sched_rounds:
            with contextlib.suppress(msgspec.MsgspecError):
                req = self._round.decode(rec.value or b"")
                self._asked_ids.add(req.round_id)
                if req.phase == "score":
                    self.state.request(req)
                elif self._replayed_places is not None:
                    self._replayed_places.append(req)
        elif rec.topic in (self.t.jobs_accepted, self.t.jobs_events, self.t.cluster_nodes):
            self._routes[rec.topic](rec)


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
    conf: PlacementSettings | None = None,
) -> ServiceStats:
    conf = conf or PlacementSettings()
    stats = ServiceStats()
    handler = PlacementHandler(settings, stats, conf)
    t = settings.topics
    spec = ServiceSpec(
        name=NAME,
        topics=[
            t.jobs_accepted,
            t.jobs_events,
            t.cluster_nodes,
            t.sched_rounds,
            t.sched_priorities,
        ],
        handle=handler,
        replay_topics=[
            t.jobs_accepted,
            t.jobs_events,
            t.cluster_nodes,
            t.sched_rounds,
            t.sched_priorities,
            t.sched_placements,
        ],
        replay=handler.replay,
    )
    return await serving.serve(settings, spec, stop, ready, group_id, stats=stats)
