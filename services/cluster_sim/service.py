"""cluster_sim service: the simulated heterogeneous cluster, driving rounds over Kafka.

Publishes `cluster.nodes`, `jobs.events` and `sched.rounds`; consumes
`sched.priorities` (scoring's answers to its rounds) and `sched.placements`
(placement's; it owns that topic's dead letters). The simulator
(`shared.sim.Simulator`, see `services.cluster_sim.rounds`) runs in a worker
thread over the trace it was given (it alone knows the true run times).

Two clocks: `--lockstep` runs virtual time as fast as the rounds come back;
otherwise the simulator's clock follows the wall clock at `--speedup` N (each
round waits until wall time has reached its virtual time; the round's own
latency is not charged to virtual time). With `--replay` it also submits each
job of the trace on `jobs.submit` when the simulator's clock reaches it (a
deployment with no other replay). A round not answered in `resend_s`
is asked again (same round_id), so a restarted scoring or placement service
picks it up. At the end it writes `--json` and `--jobs-out` exactly as
`rltune simulate` does, and stops if `exit_when_done`. Offloading jobs (from the
trace, or marked with `--offload-fraction` as `simulate` marks them) publish
`OffloadStats` from the simulator's cost model (shared/sim/offload_*.py) whenever
their rate changes, with the next round: the reward's offload terms in simulation.
With `--placer NAME+offload+replace` the simulator's re-placement checks become
`replace` rounds answered by placement, and the `MoveOrder`s are applied as
`rltune simulate` applies its own moves (services/cluster_sim/rounds.py).

Restart (after a crash, SIGKILL included): the simulator is deterministic given
the answers to its rounds, and those answers are on the topics. At start the
service reads back `sched.priorities` (scoring's driven answers),
`sched.placements`, `sched.rounds` and, with `--replay`, `jobs.submit`; it then
runs the trace from the start, answering every round already answered from what
it read, without publishing or pacing (its job events, node states and round
requests are already on the topics), which rebuilds the running jobs, the
queue, the free GPUs and the virtual clock exactly as they were. The first round
with no answer is published again (its events and node states too: consumers
are idempotent by job id and round id; a job already on `jobs.submit` is not
submitted twice) and the run goes on. In real time the virtual-to-wall mapping
is restored from the broker timestamp of the first round request, so the clock
goes on where it was (catching up on the time the service was down).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.cluster_sim.rounds import RemotePlacer, RemotePolicy, Rounds, bus_simulator
from shared import serving
from shared.bus import (
    Outgoing,
    Producer,
    Record,
    ServiceSpec,
    ServiceStats,
    Stopped,
    deliver,
    read_back,
)
from shared.cluster import ClusterSpec, load_cluster
from shared.config import BusSettings
from shared.errors import UserError
from shared.jsonfile import finite_or_null, write_json
from shared.messages import (
    JobEvent,
    NodeStatus,
    OffloadStats,
    PlacementBatch,
    PriorityBatch,
    RoundRequest,
    encode,
)
from shared.placement_api import DISCIPLINES
from shared.recipe import RunRecipe, check_round_interval
from shared.reclaim_flags import add_reclaim_args, check_reclaim_args
from shared.reject import Reject
from shared.replay import REPLAY_HEADERS, job_spec_of
from shared.sim import SimConfig, write_jobs_csv
from shared.sim.offload_jobs import describe_marking, load_marked
from shared.traces import SkipStats, TraceJob

__all__ = ["SimSettings", "add_args", "from_args", "serve"]

NAME = "cluster-sim"
log = logging.getLogger("rltune.cluster_sim")


@dataclass(frozen=True)
class SimSettings:
    trace: str = "examples/philly-2000.jsonl"
    format: str = "jsonl"
    cluster: str = "clusters/philly.yaml"
    policy: str = "fifo"  # the name scoring runs (the simulator reads its time invariance)
    placer: str = "milp"  # the name placement runs (the simulator reads it)
    limit: int | None = None
    window: int = 128
    seed: int = 0
    discipline: str = "easy"  # the one placement runs (the simulator picks its window by it)
    lockstep: bool = False
    speedup: float = 1000.0
    resend_s: float = 5.0
    json_out: str | None = None
    jobs_out: str | None = None
    exit_when_done: bool = False
    replay: bool = False  # submit the trace's jobs to jobs.submit as they arrive
    offload_fraction: float = 0.0  # as simulate's --offload-fraction (seeded marking)
    preempt: bool = False  # as simulate's --preempt (a preemptive policy: las)
    round_interval_s: float = 0.0  # as simulate's --round-interval (0: a round per event)
    # reclaim, as simulate's --no-reclaim, --grace, --min-run, --checkpoint
    reclaim: bool = True
    grace_s: float = 120.0
    min_run_s: float = 600.0
    checkpoint_s: float = 1800.0
    # real time: the wall clock (Unix s) at which the trace's first submission is due;
    # None: when the first round is asked (`rltune up` passes its replay's start)
    epoch: float | None = None

    def recipe(self) -> RunRecipe:
        """The run as `rltune simulate` would describe it (the simulator's settings)."""
        return RunRecipe(
            trace=self.trace,
            format=self.format,
            cluster=self.cluster,
            policy=self.policy,
            seed=self.seed,
            limit=self.limit,
            placer=self.placer,
            window=self.window,
            preempt=self.preempt,
            discipline=self.discipline,
            round_interval_s=self.round_interval_s,
            offload_fraction=self.offload_fraction,
        )

    def sim_config(self) -> SimConfig:
        """The simulator's settings: the recipe's, with the reclaim settings."""
        return dataclasses.replace(
            self.recipe().sim_config(), reclaim=self.reclaim, grace_s=self.grace_s,
            min_run_s=self.min_run_s, checkpoint_s=self.checkpoint_s,
        )  # fmt: skip

    def run_settings(self) -> dict[str, object]:
        """The summary JSON's `settings` (as simulate's, `RunRecipe.settings`,
        for what this service has), plus the policy and how time ran."""
        return {
            "trace": self.trace,
            "format": self.format,
            "cluster": self.cluster,
            "limit": self.limit,
            "policy": self.policy,
            "placer": self.placer,
            "discipline": self.discipline,
            "window": self.window,
            "round_interval_s": self.round_interval_s,
            "preempt": self.preempt,
            "offload_fraction": self.offload_fraction,
            "seed": self.seed,
            "time": "lockstep" if self.lockstep else f"real time x{self.speedup:g}",
        }


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", default=SimSettings.trace, help="trace file to simulate")
    p.add_argument("--format", default=SimSettings.format, help="trace format")
    p.add_argument("--cluster", default=SimSettings.cluster, help="cluster YAML / openb CSV")
    p.add_argument("--policy", default="fifo", help="the policy scoring runs")
    p.add_argument("--placer", default="milp", help="the placer placement runs")
    p.add_argument("--limit", type=int, default=None, help="first N jobs by submit time")
    p.add_argument("--window", type=int, default=128, help="jobs per round (K)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--discipline", default="easy", choices=DISCIPLINES, help="as placement's")
    p.add_argument("--lockstep", action="store_true", help="virtual time, round by round")
    p.add_argument("--speedup", type=float, default=1000.0, help="virtual s per wall s")
    p.add_argument(
        "--offload-fraction",
        type=float,
        default=0.0,
        help="mark this share of the jobs without a model size as offloading (as simulate)",
    )
    p.add_argument("--preempt", action="store_true", help="let a preemptive policy (las) preempt")
    p.add_argument(
        "--round-interval",
        type=float,
        default=0.0,
        metavar="S",
        help="rounds at most every S s of virtual time (as simulate's; default 0: every event)",
    )
    add_reclaim_args(p, "sim")
    p.add_argument(
        "--epoch",
        type=float,
        default=None,
        metavar="UNIX_S",
        help="real time: the wall-clock time (Unix seconds) at which the trace's first "
        "submission is due, shared with the replay so both clocks agree (default: when the "
        "first round is asked)",
    )
    p.add_argument(
        "--resend", type=float, default=5.0, help="ask a round again after this many s unanswered"
    )
    p.add_argument("--json", dest="json_out", default=None, help="summary JSON at the end")
    p.add_argument("--jobs-out", default=None, help="per-job CSV at the end")
    p.add_argument("--exit-when-done", action="store_true", help="stop when the trace is done")
    p.add_argument(
        "--replay",
        action="store_true",
        help="submit the trace's jobs on jobs.submit as they arrive (no separate replay)",
    )


def from_args(args: argparse.Namespace) -> SimSettings:
    if args.speedup <= 0:
        raise UserError(f"--speedup must be positive, got {args.speedup}")
    if args.window <= 0:
        raise UserError(f"--window must be positive, got {args.window}")
    if not 0.0 <= args.offload_fraction <= 1.0:
        raise UserError(f"--offload-fraction must be within [0, 1], got {args.offload_fraction}")
    if args.resend <= 0:
        raise UserError(f"--resend must be positive, got {args.resend}")
    if args.epoch is not None and not math.isfinite(args.epoch):
        raise UserError(f"--epoch must be a time in Unix seconds, got {args.epoch:g}")
    check_round_interval(args.round_interval)
    check_reclaim_args(args, live=False)
    return SimSettings(
        trace=args.trace, format=args.format, cluster=args.cluster, policy=args.policy,
        placer=args.placer, limit=args.limit, window=args.window, seed=args.seed,
        discipline=args.discipline,
        lockstep=args.lockstep, speedup=args.speedup, json_out=args.json_out,
        jobs_out=args.jobs_out, exit_when_done=args.exit_when_done, replay=args.replay,
        resend_s=args.resend, offload_fraction=args.offload_fraction, preempt=args.preempt,
        round_interval_s=args.round_interval, epoch=args.epoch, reclaim=not args.no_reclaim,
        grace_s=args.grace, min_run_s=args.min_run, checkpoint_s=args.checkpoint,
    )  # fmt: skip


def _local(conf: SimSettings) -> Any:
    """Under `--preempt`, the policy itself, for its preemption ranks (pure functions of
    attained service); None otherwise."""
    if not conf.preempt:
        return None
    from services.scoring.policies import make_policy

    return make_policy(conf.policy)


def time_invariant(policy: str) -> bool:
    """Whether the named policy's order changes only when a job finishes (a class
    attribute: read without building the policy)."""
    from services.scoring.policies import POLICIES

    cls = POLICIES.get(policy)
    return bool(getattr(cls, "time_invariant", False)) if cls is not None else False


@dataclass
class _Waits:
    score: dict[int, asyncio.Future[PriorityBatch]] = field(default_factory=dict)
    place: dict[int, asyncio.Future[PlacementBatch]] = field(default_factory=dict)


class BusChannel:
    """The simulator thread's blocking calls into the event loop (`rounds.Channel`)."""

    def __init__(
        self,
        settings: BusSettings,
        producer: Producer,
        loop: asyncio.AbstractEventLoop,
        conf: SimSettings,
        stop: asyncio.Event,
        stats: ServiceStats,
    ) -> None:
        self.t = settings.topics
        self.producer = producer
        self.loop = loop
        self.conf = conf
        self.stop = stop
        self.stats = stats
        self.waits = _Waits()
        self.t0: tuple[float, float] | None = None  # (virtual, wall) at the first round
        self.replay: dict[str, TraceJob] | None = None  # jobs still to submit (--replay)
        self.round_ms: list[float] = []
        # answers already on the topics (read back at a restart, or come before asked)
        self.known: dict[str, dict[int, Any]] = {"score": {}, "place": {}}
        self.submitted: set[str] = set()  # job ids already on jobs.submit (read back)
        self.asked = -1  # the last round asked (or answered from what was read back)
        # rounds a previous run of this service asked (read back from sched.rounds): an
        # answer to one of those may come before this run asks it again; to any other
        # round not asked yet, it is refused
        self.requested: dict[str, set[int]] = {"score": set(), "place": set()}

    def recover(self, rec: Record) -> None:
        """A record read back at start (see the module docstring, "Restart")."""
        with contextlib.suppress(msgspec.MsgspecError):
            if rec.topic == self.t.sched_priorities:
                prio = msgspec.json.decode(rec.value or b"", type=PriorityBatch)
                if prio.driven:
                    self.known["score"][prio.round_id] = prio
            elif rec.topic == self.t.sched_placements:
                place = msgspec.json.decode(rec.value or b"", type=PlacementBatch)
                self.known["place"][place.round_id] = place
            elif rec.topic == self.t.sched_rounds:
                req = msgspec.json.decode(rec.value or b"", type=RoundRequest)
                self.requested["score" if req.phase == "score" else "place"].add(req.round_id)
                if self.t0 is None and req.phase == "score" and rec.timestamp_ms > 0:
                    ago = time.time() - rec.timestamp_ms / 1e3  # wall clock: the broker's
                    self.t0 = (req.time, time.monotonic() - ago)
            elif rec.topic == self.t.jobs_submit and rec.key is not None:
                self.submitted.add(rec.key.decode(errors="replace"))

    # called from the simulator thread
    def score(
        self,
        req: RoundRequest,
        nodes: list[NodeStatus],
        events: list[JobEvent],
        offload: list[OffloadStats],
    ) -> PriorityBatch:
        outs = self._outs(events, nodes, offload)
        if self.replay is not None:  # this round's arrivals, submitted as a user would
            for jid in req.arrived:
                tj = self.replay.pop(jid, None)
                if tj is not None and jid not in self.submitted:
                    spec = job_spec_of(tj)
                    spec.submit_time = tj.submit_s
                    outs.append(Outgoing(self.t.jobs_submit, jid, encode(spec)))
        return self._call(self._ask(req, outs, self.waits.score))

    def place(self, req: RoundRequest) -> PlacementBatch:
        return self._call(self._ask(req, [], self.waits.place))

    def replace(self, req: RoundRequest, nodes: list[NodeStatus]) -> PlacementBatch:
        """A re-placement round: answered by placement on `sched.placements` like a place
        round (its own round id)."""
        return self._call(self._ask(req, self._outs([], nodes, []), self.waits.place))

    def publish(
        self,
        events: Sequence[JobEvent],
        nodes: Sequence[NodeStatus],
        offload: Sequence[OffloadStats],
    ) -> None:
        self._call(self._publish(self._outs(events, nodes, offload)))

    def _outs(
        self,
        events: Sequence[JobEvent],
        nodes: Sequence[NodeStatus],
        offload: Sequence[OffloadStats],
    ) -> list[Outgoing]:
        outs = [Outgoing(self.t.jobs_events, e.job_id, encode(e)) for e in events]
        outs += [Outgoing(self.t.cluster_nodes, n.node_id, encode(n)) for n in nodes]
        outs += [Outgoing(self.t.offload_stats, o.job_id, encode(o)) for o in offload]
        return outs

    def _call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result()

    # on the event loop
    async def _publish(self, outs: list[Outgoing]) -> None:
        """Through the bus's one retry loop: an outage of any length is waited out
        (Stopped if the service stops first). The trace's own jobs go marked as a
        replay's (the arrival service tells them apart from users')."""
        replayed = self.t.jobs_submit
        self.stats.published += await deliver(
            self.producer,
            outs,
            self.stop,
            NAME,
            lambda o: (o, list(REPLAY_HEADERS) if o.topic == replayed else []),
            stats=self.stats,
        )

    async def _pace(self, now: float) -> None:
        if self.conf.lockstep:
            return
        if self.t0 is None:
            self.t0 = (now, time.monotonic())
        due = self.t0[1] + (now - self.t0[0]) / self.conf.speedup
        delay = due - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)

    async def _ask(self, req: RoundRequest, outs: list[Outgoing], waits: dict[int, Any]) -> Any:
        self.asked = max(self.asked, req.round_id)
        phase = "score" if req.phase == "score" else "place"  # replace: answered as place
        known = self.known[phase].pop(req.round_id, None)
        if known is not None and req.round_id not in self.requested[phase]:
            # on the topic before any run of this service asked that round: not an answer
            log.warning("round %d (%s): ignored an answer read back for a round never asked",
                        req.round_id, phase)  # fmt: skip
            self.stats.extra["answers_never_asked"] += 1
            known = None
        if known is not None:  # answered before a restart: everything is on the topics
            self.stats.extra["rounds_recovered"] += 1
            return known
        if phase == "score":
            await self._pace(req.time)
        t0 = time.perf_counter()
        fut = waits[req.round_id] = self.loop.create_future()
        msg = Outgoing(self.t.sched_rounds, str(req.round_id), encode(req))
        await self._publish([*outs, msg])
        self.stats.extra["rounds_" + req.phase] += 1
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            while True:
                if self.stop.is_set():
                    raise Stopped
                done, _ = await asyncio.wait(
                    [fut, stopping],
                    timeout=self.conf.resend_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if fut.done():
                    break
                if not done:  # no answer yet: ask again (services answer by round_id)
                    self.stats.extra["rounds_resent"] += 1
                    log.warning("round %d (%s): no answer, asking again", req.round_id, req.phase)
                    await self._publish([msg])
        finally:
            stopping.cancel()
            waits.pop(req.round_id, None)
        self.round_ms.append((time.perf_counter() - t0) * 1e3)
        if len(self.round_ms) % 16 == 0:
            recent = sorted(self.round_ms[-256:])
            self.stats.extra["round_p50_ms"] = round(recent[len(recent) // 2])
            self.stats.extra["virtual_time_s"] = round(req.time)
        return fut.result()

    def answer(self, rid: int, phase: str, value: Any) -> None:
        """Take an answer to round `rid`: the first to a round asked and waiting, or
        (restarting) to a round a previous run asked; a repeat (a resend's second
        answer, or one already read back) is counted and dropped. An answer to a round
        never asked is refused (Reject: to the dead-letter topic), so a forged batch
        cannot slip into a round before it is asked."""
        waits = self.waits.score if phase == "score" else self.waits.place
        fut = waits.get(rid)
        if fut is not None and not fut.done():
            fut.set_result(value)
        elif rid <= self.asked or (rid in self.requested[phase] and rid in self.known[phase]):
            self.stats.extra["answers_repeated"] += 1
        elif rid in self.requested[phase]:
            self.stats.extra["answers_before_asked"] += 1
            self.known[phase][rid] = value
        else:
            what = "priorities" if phase == "score" else "placements"
            raise Reject(
                f"{what} for round {rid}, which was never asked (the last asked is {self.asked})",
                kind="unasked",
            )


class Handler:
    """Answers to the simulator's rounds; bad placement batches are dead-lettered."""

    def __init__(self, settings: BusSettings, stats: ServiceStats) -> None:
        self.t = settings.topics
        self.stats = stats
        self.channel: BusChannel | None = None
        self._prio = msgspec.json.Decoder(PriorityBatch)
        self._place = msgspec.json.Decoder(PlacementBatch)

    def __call__(self, rec: Record) -> Sequence[Outgoing]:
        if rec.topic == self.t.sched_placements:
            try:
                batch = self._place.decode(rec.value or b"")
            except msgspec.MsgspecError as exc:
                raise Reject(f"invalid PlacementBatch: {exc}", kind="invalid") from None
            if self.channel is not None:
                self.channel.answer(batch.round_id, "place", batch)
        else:
            try:
                prio = self._prio.decode(rec.value or b"")
            except msgspec.MsgspecError:
                self.stats.extra["ignored_bad_priorities"] += 1  # placement owns its dlq
                return ()
            if prio.driven and self.channel is not None:
                self.channel.answer(prio.round_id, "score", prio)
        return ()


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
    conf: SimSettings | None = None,
) -> ServiceStats:
    conf = conf or SimSettings()
    cluster = load_cluster(conf.cluster)
    skipped = SkipStats()
    jobs = load_marked(
        conf.trace, conf.format, cluster, skipped, conf.limit, conf.offload_fraction, conf.seed
    )
    if conf.offload_fraction:
        log.info("%s", describe_marking(conf.offload_fraction, conf.seed))
    stats = ServiceStats()
    handler = Handler(settings, stats)
    t = settings.topics
    spec = ServiceSpec(name=NAME, topics=[t.sched_priorities, t.sched_placements], handle=handler)

    async def simulation(s: serving.Serving) -> None:
        await _simulate(s, handler, cluster, jobs, conf)

    return await serving.serve(settings, spec, stop, ready, group_id, stats=stats, main=simulation)


async def _simulate(
    s: serving.Serving,
    handler: Handler,
    cluster: ClusterSpec,
    jobs: list[TraceJob],
    conf: SimSettings,
) -> None:
    """The service's own work beside its consumer: read back the rounds already
    answered, simulate the trace with the policy and the placer over the bus, write
    the results; then, unless it exits when done, wait for `stop`."""
    settings, stop, stats, t = s.settings, s.stop, s.stats, s.settings.topics
    loop = asyncio.get_running_loop()
    producer = Producer(settings, client_id=NAME)
    channel = handler.channel = BusChannel(settings, producer, loop, conf, stop, stats)
    await s.until_built()  # (the broker is there: read back what was done)
    back = [t.sched_rounds, t.sched_priorities, t.sched_placements]
    back += [t.jobs_submit] if conf.replay else []
    seen = await read_back(settings, back, channel.recover)
    if seen.get(t.sched_rounds):
        log.info(
            "restart: %d answered rounds read back, the trace is run again up to them",
            len(channel.known["score"]),
        )
    if conf.epoch is not None and not conf.lockstep and jobs:
        # the replay's clock: the first submission due at the epoch, wherever this
        # service (re)started; a start after it catches up round by round
        first = min(j.submit_s for j in jobs)
        channel.t0 = (first, time.monotonic() - (time.time() - conf.epoch))
    async with producer:
        if conf.replay:
            channel.replay = {j.job_id: j for j in jobs}
        rounds = Rounds(channel, conf.window)
        sim = bus_simulator(
            cluster,
            RemotePolicy(conf.policy, time_invariant(conf.policy), rounds, _local(conf)),
            RemotePlacer(conf.placer, rounds),
            conf.sim_config(),
        )
        s.ready.set()
        log.info("simulating %d jobs (%s)", len(jobs), "lockstep" if conf.lockstep else "real time")
        done = threading.Event()

        def run_sim() -> Any:
            try:
                result = sim.run(jobs)
                channel.publish(*rounds.flush())
                return result
            finally:
                done.set()

        try:
            result = await asyncio.to_thread(run_sim)
        except Stopped:
            result = None
        if result is not None:
            stats.extra["done"] = 1
            stats.extra["jobs_finished"] = sum(1 for r in result.records if r.finished)
            stats.extra["moves"] = result.replacements
            stats.extra["bad_moves"] = rounds.bad_moves
            if conf.jobs_out:
                write_jobs_csv(result.records, conf.jobs_out)
            if conf.json_out:
                summary = {**result.summary(), "settings": conf.run_settings()}
                write_json(finite_or_null(summary), conf.json_out)
            x = stats.extra
            log.info(
                "done: %d rounds asked, %d recovered from the topics; %s",
                x["rounds_score"], x["rounds_recovered"], result.summary(),
            )  # fmt: skip
        if not conf.exit_when_done:
            await stop.wait()
