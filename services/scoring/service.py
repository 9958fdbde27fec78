"""Scoring service: the waiting queue and the policy → `sched.priorities`.

Consumes `jobs.accepted`, `jobs.rejected`, `jobs.events`, `jobs.kill`,
`cluster.nodes`, `sched.rounds` and `rl.rewards`; owns the dead letters of `sched.rounds` and
`rl.rewards` (bad `cluster.nodes` / `jobs.events` messages are counted here and
dead-lettered by telemetry). The logic is `services.scoring.queue`.

Rounds (`--rounds`): `driven` answers the executor's `RoundRequest`s (cluster_sim);
`free` publishes a round after every change, at most one per `tick`
(live hosts); `auto` (default) is driven once a round request has been seen and
free until then. A `rl:PATH` policy is reloaded when the file changes, without
stopping. After a restart the state is rebuilt from the topics (`replay`).
With `--ledger` the fair-share usage (drf's tie-break, the `fair_share` feature)
is the ledger service's table, read from its changelog
(`<prefix>ledger-usage-changelog`, the latest row per queue), instead of being kept
here from `jobs.events`. Rewards on `rl.rewards` are read and counted; with
`--learn` (off by default; learned policies only) they train the policy online with PPO
(`services.scoring.online`): it then samples its rankings, and every
`--learn-episodes` rewards one update changes the weights it ranks with.

A `KillRequest` on `jobs.kill` for a job that is still waiting (free rounds) takes
it out of the queue and publishes it `cancelled` on `jobs.events` ("killed while
queued"), so placement never places it and telemetry counts it; a kill that comes
before the job's accepted record is remembered (the last `PENDING_KILLS`) and
applied when it arrives. A job already given GPUs or running is the host agent's
to stop; under driven rounds the executor's simulator owns the queue, and kills
are counted (`kills_ignored_driven`) and left alone.

Reclaim on live hosts (free rounds, a `--cluster` file whose queues have
guarantees): `services.scoring.reclaim` decides which borrowers stop for a
queue's guarantee (shared/tenancy.py's rules, with `--grace` and `--min-run`),
and asks their host agents on `jobs.kill` (`KillRequest` with `requeue`); they
come back as `preempted` and wait in the queue again. Under driven rounds the
executor's simulator decides reclaim itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from services.scoring.policies import make_policy
from services.scoring.queue import ScoringState
from services.scoring.reclaim import LiveReclaim
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
from shared.fairshare import row_from_changelog, usage_changelog
from shared.messages import (
    Job,
    JobEvent,
    KillRequest,
    NodeStatus,
    PlacementBatch,
    PriorityBatch,
    Rejection,
    Reward,
    RoundRequest,
    encode,
)
from shared.reclaim_flags import GRACE_S, MIN_RUN_S, add_reclaim_args, check_reclaim_args
from shared.reject import Reject
from shared.tenancy import Quota

__all__ = ["ScoringSettings", "add_args", "from_args", "serve"]

NAME = "scoring"
log = logging.getLogger("rltune.scoring")
ROUND_MODES = ("auto", "driven", "free")
RETRY_S = 1.0  # free rounds: ask again this often while jobs wait
PENDING_KILLS = 10_000  # kills of jobs not seen yet, kept until their accepted record


@dataclass(frozen=True)
class ScoringSettings:
    policy: str = "fifo"
    cluster: str | None = None  # the cluster's node order and speeds; None = as nodes report
    window: int = 128
    seed: int = 0
    rounds: str = "auto"
    tick_s: float = 0.05  # at most one free round per tick
    reload_s: float = 2.0  # how often a checkpoint file is checked for a newer version
    learn: bool = False  # PPO online from rl.rewards (learned policies only)
    learn_episodes: int = 4  # rewards per update
    grace_s: float = GRACE_S  # reclaim on live hosts: SIGTERM, then SIGKILL after this
    min_run_s: float = MIN_RUN_S  # reclaim: a job is never preempted in its first S seconds
    reclaim_every_s: float = 0.5  # reclaim: how often the queues are looked at
    ledger: bool = False  # fair share from the ledger service's table, not from the events


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="fifo", help="fifo, sjf-est, ..., rl, rl:PATH")
    p.add_argument("--cluster", default=None, help="cluster spec (default: nodes as they report)")
    p.add_argument("--window", type=int, default=128, help="jobs per PriorityBatch (K)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", default="auto", choices=ROUND_MODES, help="who starts rounds")
    p.add_argument(
        "--learn",
        action="store_true",
        help="learn online from rl.rewards with PPO (rl policies; off by default)",
    )
    p.add_argument("--learn-episodes", type=int, default=4, help="rewards per PPO update")
    add_reclaim_args(p, "live")  # (free rounds, with guarantees or preempt_lower in --cluster)
    p.add_argument(
        "--ledger",
        action="store_true",
        help="read fair share's decayed usage from the ledger service's table (its "
        "changelog) instead of keeping it from jobs.events (off: lockstep runs keep it "
        "in step with the rounds)",
    )


def from_args(args: argparse.Namespace) -> ScoringSettings:
    if args.window <= 0:
        raise UserError(f"--window must be positive, got {args.window}")
    policy = make_policy(args.policy)  # a bad name is one line and exit 2, before connecting
    if args.learn and not hasattr(policy, "recorder"):
        raise UserError(f"--learn needs a learned policy (rl, rl:PATH), not {args.policy!r}")
    if args.learn_episodes <= 0:
        raise UserError(f"--learn-episodes must be positive, got {args.learn_episodes}")
    check_reclaim_args(args, live=True)
    return ScoringSettings(
        args.policy, args.cluster, args.window, args.seed, args.rounds,
        learn=args.learn, learn_episodes=args.learn_episodes, grace_s=args.grace,
        min_run_s=args.min_run, ledger=args.ledger,
    )  # fmt: skip


class ScoringHandler:
    def __init__(self, settings: BusSettings, stats: ServiceStats, conf: ScoringSettings) -> None:
        self.t = settings.topics
        self.stats = stats
        self.conf = conf
        cluster = load_cluster(conf.cluster) if conf.cluster else None
        self.state = ScoringState(make_policy(conf.policy), cluster, conf.window, conf.seed)
        self.reclaimer: LiveReclaim | None = None
        quota = Quota(cluster.queues, cluster.priority_classes) if cluster is not None else None
        if cluster is not None and quota and (quota.has_guarantees() or quota.preempts_lower()):
            self.reclaimer = LiveReclaim(cluster, conf.grace_s, conf.min_run_s)
        self._last_reclaim = 0.0
        self.driven = conf.rounds == "driven"
        self.free_round_id = 0
        self._job = msgspec.json.Decoder(Job)
        self._event = msgspec.json.Decoder(JobEvent)
        self._node = msgspec.json.Decoder(NodeStatus)
        self._round = msgspec.json.Decoder(RoundRequest)
        self._reward = msgspec.json.Decoder(Reward)
        self._rejection = msgspec.json.Decoder(Rejection)
        self._kill = msgspec.json.Decoder(KillRequest)
        self._pending_kills: OrderedDict[str, str] = OrderedDict()
        self._out: list[Outgoing] = []  # events a record causes (jobs killed while queued)
        self._replayed: list[RoundRequest] = []
        self._answered = -1
        self._rebuilt = False
        self._last_free = 0.0
        self._routes = {
            self.t.jobs_accepted: self._accepted,
            self.t.jobs_rejected: self._rejected,
            self.t.jobs_events: self._events,
            self.t.cluster_nodes: self._nodes,
            self.t.sched_rounds: self._rounds,
            self.t.rl_rewards: self._rewards,
            self.t.sched_placements: self._placements,
            self.t.jobs_kill: self._kills,
            usage_changelog(settings.topic_prefix): self._ledger,
        }
        self._placement = msgspec.json.Decoder(PlacementBatch)
        self.learner: Any = None
        if conf.learn:
            import torch

            from services.scoring.online import OnlineLearner

            # the service's process, its choice: the PPO update runs on the event loop
            # between two records, a few small matrix products, where intra-op threads
            # add only their synchronisation (and, on a busy host, a long tail)
            torch.set_num_threads(1)
            self.learner = OnlineLearner(
                self.state.policy,  # type: ignore[arg-type]
                episodes=conf.learn_episodes,
                seed=conf.seed,
            )

    @property
    def free(self) -> bool:
        return self.conf.rounds == "free" or (self.conf.rounds == "auto" and not self.driven)

    def __call__(self, rec: Record) -> Sequence[Outgoing]:
        self._rebuild()
        self._routes[rec.topic](rec)
        out, self._out = self._out, []
        out += [
            Outgoing(self.t.sched_priorities, str(b.round_id), encode(b))
            for b in self.state.answer_rounds()
        ]
        self.stats.extra["queue_length"] = self.state.queue_length
        self.stats.extra["rounds"] = self.state.counts["rounds"]
        return out

    # ---- topics ---------------------------------------------------------------------------
    def _accepted(self, rec: Record) -> None:
        try:
            job = self._job.decode(rec.value or b"")
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_job"] += 1
            return
        self.state.accepted(job, self.free)
        reason = self._pending_kills.pop(job.job_id, None)
        if reason is not None:
            self._cancel(job.job_id, reason)

    def _kills(self, rec: Record) -> None:
        try:
            req = self._kill.decode(rec.value or b"")
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_kill"] += 1  # the host agents dead-letter it
            return
        if req.requeue:  # a preemption (ours): the host agent stops it, `preempted` requeues it
            if self.reclaimer is not None:
                self.reclaimer.restore(req, rec.timestamp_ms / 1e3)
            return
        if not self.free:
            self.stats.extra["kills_ignored_driven"] += 1
            return
        where = self.state.where(req.job_id)
        if where == "unknown" and req.job_id not in self.state.dropped:
            self._pending_kills[req.job_id] = req.reason  # its accepted record may follow
            self._pending_kills.move_to_end(req.job_id)
            while len(self._pending_kills) > PENDING_KILLS:
                self._pending_kills.popitem(last=False)
        elif where == "queued":
            self._cancel(req.job_id, req.reason)
        else:
            self.stats.extra[f"kills_{where}"] += 1  # placed/running: the host agent's

    def _cancel(self, job_id: str, reason: str) -> None:
        if not self.free or not self.state.cancel(job_id):
            return
        detail = f"killed while queued{f' ({reason})' if reason else ''}"
        event = JobEvent(job_id, "cancelled", time.time(), [], detail)
        self._out.append(Outgoing(self.t.jobs_events, job_id, encode(event)))
        self.stats.extra["kills_queued"] += 1
        log.info("%s %s", job_id, detail)

    def _rejected(self, rec: Record) -> None:
        with contextlib.suppress(msgspec.MsgspecError):
            r = self._rejection.decode(rec.value or b"")
            if r.job_id and rec.topic == self.t.jobs_rejected:
                self.state.rejected(r.job_id)

    def _events(self, rec: Record) -> None:
        try:
            self.state.event(self._event.decode(rec.value or b""), self.free)
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_event"] += 1  # telemetry dead-letters it

    def _nodes(self, rec: Record) -> None:
        try:
            self.state.node(self._node.decode(rec.value or b""))
        except (msgspec.MsgspecError, ValueError):
            self.stats.extra["ignored_bad_node_status"] += 1  # telemetry dead-letters it

    def _rounds(self, rec: Record) -> None:
        try:
            req = self._round.decode(rec.value or b"")
        except msgspec.MsgspecError as exc:
            raise Reject(f"invalid RoundRequest: {exc}", kind="invalid") from None
        if req.phase == "score":
            self.driven = True
            self.state.request(req)

    def _placements(self, rec: Record) -> None:
        if not self.free:
            return  # driven: the executor's round request says what started
        try:
            batch = self._placement.decode(rec.value or b"")
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_placement"] += 1  # its executor dead-letters it
            return
        self.state.placed([a.job_id for a in batch.assignments], batch.round_id)

    def _ledger(self, rec: Record) -> None:
        """A row of the ledger service's `usage` table (services/ledger)."""
        got = row_from_changelog(rec.key, rec.value)
        if got is None:
            self.stats.extra["ignored_bad_ledger_row"] += 1
            return
        self.state.fair.load(*got)
        self.stats.extra["ledger_rows"] += 1

    def _rewards(self, rec: Record) -> None:
        try:
            reward = self._reward.decode(rec.value or b"")
        except msgspec.MsgspecError as exc:
            raise Reject(f"invalid Reward: {exc}", kind="invalid") from None
        self.stats.extra["rewards_seen"] += 1
        if self.learner is not None:
            losses = self.learner.reward(reward.value)
            if losses is not None:
                self.stats.extra["online_updates"] = self.learner.updates
                for k, v in losses.items():
                    self.stats.extra[f"online_{k}_loss"] = round(v, 6)

    # ---- restart --------------------------------------------------------------------------
    def replay(self, rec: Record) -> None:
        """Read back at start: jobs, events, nodes, round requests, our own answers and
        the preemptions we asked (`LiveReclaim.restore`)."""
        if rec.topic == self.t.sched_rounds:
            with contextlib.suppress(msgspec.MsgspecError):
                req = self._round.decode(rec.value or b"")
                if req.phase == "score":
                    self._replayed.append(req)
                    self.driven = self.conf.rounds != "free"
        elif rec.topic == self.t.sched_priorities:
            with contextlib.suppress(msgspec.MsgspecError):
                b = msgspec.json.decode(rec.value or b"", type=PriorityBatch)
                if b.driven:
                    self._answered = max(self._answered, b.round_id)
                else:
                    self.free_round_id = max(self.free_round_id, b.round_id + 1)
        elif rec.topic == self.t.jobs_accepted:
            with contextlib.suppress(msgspec.MsgspecError):
                self.state.accepted(self._job.decode(rec.value or b""), False)
        elif rec.topic == self.t.jobs_events:
            with contextlib.suppress(msgspec.MsgspecError):
                self.state.event(self._event.decode(rec.value or b""), False)
        elif rec.topic == self.t.jobs_kill:  # the preemptions asked: still stopping?
            with contextlib.suppress(msgspec.MsgspecError):
                kill = self._kill.decode(rec.value or b"")
                if kill.requeue and self.reclaimer is not None:
                    self.reclaimer.restore(kill, rec.timestamp_ms / 1e3)
        elif rec.topic in (self.t.jobs_rejected, self.t.cluster_nodes) or (
            self.conf.ledger and rec.topic == usage_changelog(self.t.prefix)
        ):
            self._routes[rec.topic](rec)

    def _rebuild(self) -> None:
        if self._rebuilt:
            return
        self._rebuilt = True
        self.state.rebuild(self._replayed, self._answered, self.free)
        self._replayed = []

    # ---- free rounds ----------------------------------------------------------------------
    def free_round(self) -> PriorityBatch | None:
        """A round after a change, and again every `retry_s` while jobs wait (a round
        placement could not use, e.g. read before the jobs' accepted records, is
        asked again; placement never places a job twice)."""
        if not self._rebuilt or not self.free:
            return None  # (the state is rebuilt once the read-back is over: first record)
        now = time.monotonic()
        if not self.state.dirty and (not self.state.queued or now < self._last_free + RETRY_S):
            return None
        self._last_free = now
        batch = self.state.free_round(self.free_round_id, time.time())
        if batch is not None:
            self.free_round_id += 1
        return batch

    def reclaim(self) -> list[Outgoing]:
        """Free rounds with guarantees: the preemptions reclaim asks for now (every
        `reclaim_every_s` while jobs wait), as `KillRequest`s with `requeue`."""
        r = self.reclaimer
        if r is None or not self._rebuilt or not self.free:
            return []
        now = time.monotonic()
        if now < self._last_reclaim + self.conf.reclaim_every_s:
            return []
        self._last_reclaim = now
        if not self.state.queued:
            self.state.first = []
            return []
        kills = r.check(self.state, time.time())
        for k in kills:
            log.info("preempting %s: %s", k.job_id, k.reason)
        self.stats.extra["preemptions_asked"] += len(kills)
        if kills or self.state.first:
            self.state.dirty = True  # a round with the reclaiming jobs first
        return [Outgoing(self.t.jobs_kill, k.job_id, encode(k)) for k in kills]

    def reload(self, name: str) -> None:
        self.state.swap_policy(make_policy(name), self.conf.seed)
        if self.learner is not None:
            self.learner.attach(self.state.policy)
        log.info("policy %s reloaded", name)


async def _ticker(
    settings: BusSettings, handler: ScoringHandler, stop: asyncio.Event, stats: ServiceStats
) -> None:
    """Free rounds, and checkpoint reloads, on a clock of their own."""
    conf = handler.conf
    path = conf.policy[3:] if conf.policy.startswith("rl:") else None
    mtime = _mtime(path)
    next_reload = time.monotonic() + conf.reload_s
    next_report = time.monotonic() + 5.0
    async with Producer(settings, client_id=f"{NAME}-rounds") as producer:
        while not stop.is_set():
            if handler.state.full:  # a backlog: the next K at once (placement paces it)
                await asyncio.sleep(0)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), conf.tick_s)
            if time.monotonic() >= next_report:  # a round stuck on a missing input: say so
                next_report = time.monotonic() + 5.0
                for req in list(handler.state.rounds.pending.values())[:1]:
                    miss = handler.state.waiting_for(req)
                    log.warning("round %d waits for %s", req.round_id, ", ".join(miss[:5]))
            outs = handler.reclaim()
            batch = handler.free_round()
            if batch is not None:
                outs.append(
                    Outgoing(settings.topics.sched_priorities, str(batch.round_id), encode(batch))
                )
            if outs:
                try:  # the bus's one retry loop: an outage is waited out
                    stats.published += await deliver(
                        producer, outs, stop, NAME, lambda o: (o, []), stats=stats
                    )
                except Stopped:
                    break
            if path is not None and time.monotonic() >= next_reload:
                next_reload = time.monotonic() + conf.reload_s
                now = _mtime(path)
                if now is not None and now != mtime:
                    mtime = now
                    try:
                        handler.reload(conf.policy)
                    except Exception as exc:  # a half-written file: keep the old policy
                        stats.extra["policy_reload_failed"] += 1
                        log.warning("cannot reload %s: %s", path, exc)


def _mtime(path: str | None) -> float | None:
    if path is None:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
    conf: ScoringSettings | None = None,
) -> ServiceStats:
    conf = conf or ScoringSettings()
    stats = ServiceStats()
    handler = ScoringHandler(settings, stats, conf)
    t = settings.topics
    ledger = [usage_changelog(settings.topic_prefix)] if conf.ledger else []
    spec = ServiceSpec(
        name=NAME,
        topics=[
            t.jobs_accepted, t.jobs_rejected, t.jobs_events, t.cluster_nodes, t.sched_rounds,
            t.rl_rewards, t.sched_placements, t.jobs_kill, *ledger,
        ],
        handle=handler,
        replay_topics=[
            t.jobs_accepted, t.jobs_rejected, t.jobs_events, t.cluster_nodes, t.sched_rounds,
            t.sched_priorities, t.jobs_kill, *ledger,
        ],
        replay=handler.replay,
    )  # fmt: skip

    async def ticker(s: serving.Serving) -> None:
        await _ticker(settings, handler, s.stop, stats)

    return await serving.serve(settings, spec, stop, ready, group_id, stats=stats, beside=[ticker])
