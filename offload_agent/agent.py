"""The host agent (`rltune service offload-agent`), one per GPU host.

Relays between the training processes on this host (a Unix socket, see
`offload_agent.ipc`) and Kafka:

* a process's `TensorProfile` → `offload.profiles` (node id filled in);
* `offload.plans` → the process running that job (plans for jobs on other
  hosts are skipped; plans that do not decode go to `offload.plans.dlq`);
* a process's `OffloadStats` → `offload.stats` (node id filled in);
* a `NodeStatus` on `cluster.nodes` at start, every `status_interval_s` and
  whenever a job starts or ends here: from pynvml where the host has GPUs
  (`source` "pynvml"), else from the configured inventory
  (`RLTUNE_NODE_GPU_TYPE`, `RLTUNE_NODE_GPUS`; `source` "inventory"; with
  `RLTUNE_NODE_EMULATE=1` the inventory even on a GPU host), with the
  GPUs its running jobs hold taken off the free ones;
* `jobs.kill` (`KillRequest`, public) → a job running here is stopped: SIGTERM to
  its process group, SIGKILL after `kill_grace_s`; its exit is reported `failed`
  with "killed on request (reason)". A job not running here is never started
  here afterwards (a kill can race the job's placement: if the placement comes
  later, it is answered `failed`, "killed before it started"); one that does not
  decode goes to `jobs.rejected`. (A job still waiting in the queue is taken out
  by the scoring service.)
* `jobs.kill` with `requeue` (a preemption, from scoring's reclaim): the job's
  process group gets SIGTERM, SIGKILL after the request's `grace_s` (else
  `kill_grace_s`); its exit is reported `preempted` and the job goes back to the
  queue (a later placement starts it again). A job not running here is left alone.
* `jobs.events`: a `failed` event from another node for a job that also runs here
  stops it here (a job given several nodes runs or fails as one);
* `jobs.exits` (`NodeExit`, agents only): a job given several nodes is `finished`
  when the process on every one of them has exited 0. Each agent publishes its
  node's exit 0 there instead of a `finished`, and the agent whose own record
  completes the set publishes the job's one `finished` (all its nodes in
  `node_ids`); a failure anywhere is the job's `failed` at once (the detail names
  the node and its exit code) and stops the others;
* `sched.placements` for this node → the job's command (from `jobs.accepted`)
  started on its GPUs, `JobEvent`s on `jobs.events` (see `offload_agent.jobs`);
  each job swaps under `RLTUNE_SWAP_DIR`/<job>, removed when it exits, and writes
  its stdout / stderr to `RLTUNE_JOB_LOGS`/<job>.out / .err (default
  <tmp>/rltune-jobs/<node>); a failed job's event carries its exit code and the
  last lines of its stderr; a command that cannot start is `failed` with the reason.
  Bad messages on those two topics are counted and ignored (their producers'
  consumers own the dead-letter topics).

Each agent reads every plan (its own consumer group, per node) and keeps only
those for its local jobs that are newer than the profile they answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from aiokafka.errors import KafkaError

from offload_agent import ipc
from offload_agent.jobs import JobRunner, Started
from offload_agent.launcher import launch, node_status
from offload_agent.metrics import forget, observe
from offload_agent.nvme import swap_dir
from shared import serving
from shared.bus import Outgoing, Producer, Record, ServiceSpec, ServiceStats
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import (
    Job,
    JobEvent,
    KillRequest,
    NodeExit,
    NodeStatus,
    PlacementBatch,
    PrefetchPlan,
    encode,
)
from shared.reject import Reject

__all__ = ["AgentConfig", "HostAgent", "serve"]

NAME = "offload-agent"
PUBLISH_GIVE_UP_S = 600.0  # a job event not published after this long: the error stands
log = logging.getLogger("rltune.offload_agent")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    socket_path: Path
    node_id: str
    status_interval_s: float = 10.0
    swap_root: Path | None = None  # jobs started here swap under it (RLTUNE_SWAP_DIR)
    inventory: tuple[str, int] | None = None  # (GPU type, GPUs) for a host without pynvml
    kill_grace_s: float = 10.0  # SIGTERM, then SIGKILL after this long (a kill on request)
    job_logs: Path | None = None  # each job's stdout / stderr (RLTUNE_JOB_LOGS)
    emulate: bool = False  # the inventory even where pynvml sees GPUs (RLTUNE_NODE_EMULATE=1)

    @classmethod
    def from_env(cls) -> AgentConfig:
        node = os.environ.get("RLTUNE_NODE_ID") or socket.gethostname()
        inventory = None
        count = os.environ.get("RLTUNE_NODE_GPUS")
        if count:
            if not count.isdigit() or not 0 < int(count) <= 1024:
                raise UserError(f"RLTUNE_NODE_GPUS={count!r} must be a number of GPUs (1-1024)")
            inventory = (os.environ.get("RLTUNE_NODE_GPU_TYPE") or "GPU", int(count))
        logs = os.environ.get("RLTUNE_JOB_LOGS")
        job_logs = Path(logs) if logs else Path(tempfile.gettempdir()) / "rltune-jobs" / node
        emulate = os.environ.get("RLTUNE_NODE_EMULATE", "") not in ("", "0")
        if emulate and inventory is None:
            raise UserError("RLTUNE_NODE_EMULATE needs RLTUNE_NODE_GPUS (the emulated GPUs)")
        sock = ipc.socket_path()
        if len(os.fsencode(sock)) > 107:  # sun_path: 108 bytes with the terminating NUL
            raise UserError(
                f"RLTUNE_OFFLOAD_SOCKET={str(sock)!r} is {len(os.fsencode(sock))} bytes; "
                "a Unix socket's path is at most 107"
            )
        return cls(
            sock,
            node,
            swap_root=swap_dir(),
            inventory=inventory,
            job_logs=job_logs,
            emulate=emulate,
        )


@dataclass
class _Conn:
    writer: asyncio.StreamWriter
    job_id: str = ""
    profile_ms: int = 0  # when its latest profile went out


class HostAgent:
    """Local connections on one side, Kafka on the other."""

    def __init__(
        self, settings: BusSettings, config: AgentConfig, producer: Producer, stats: ServiceStats
    ) -> None:
        self.topics = settings.topics
        self.config = config
        self.producer = producer
        self.stats = stats
        self.jobs: dict[str, _Conn] = {}
        env = {**os.environ, "RLTUNE_OFFLOAD_SOCKET": str(config.socket_path)}
        self.runner = JobRunner(
            config.node_id, launch, env, swap_root=config.swap_root, logs=config.job_logs
        )
        if config.inventory is not None:
            self.runner.gpus = config.inventory[1]
        self.watchers: set[asyncio.Task[None]] = set()
        self._plan = msgspec.json.Decoder(PrefetchPlan)
        self._job = msgspec.json.Decoder(Job)
        self._event = msgspec.json.Decoder(JobEvent)
        self._placements = msgspec.json.Decoder(PlacementBatch)
        self._kill = msgspec.json.Decoder(KillRequest)
        self._exit = msgspec.json.Decoder(NodeExit)

    async def on_record(self, rec: Record) -> Sequence[Outgoing]:
        """Bus handler: route by topic."""
        if rec.topic == self.topics.offload_plans:
            return await self.on_plan(rec)
        if rec.topic == self.topics.jobs_accepted:
            return await self._announce(*self._learn(rec))
        if rec.topic == self.topics.jobs_kill:
            return await self.on_kill(rec)
        if rec.topic == self.topics.jobs_events:
            return self.on_event(rec)
        if rec.topic == self.topics.jobs_exits:
            return self.on_exit(rec)
        return await self.on_placements(rec)

    def on_exit(self, rec: Record) -> Sequence[Outgoing]:
        """A node's process of a job given several nodes exited 0: the job's `finished`
        when this is our own record and every node's is in (see `JobRunner.record_exit`).
        Returned, not published here, so that the bus stamps it with this input and a
        restarted agent does not answer the same record twice."""
        try:
            ex = self._exit.decode(rec.value or b"")
        except msgspec.MsgspecError as exc:
            raise Reject(f"invalid NodeExit: {exc}", kind="invalid") from None
        event = self.runner.record_exit(ex)
        if event is None:
            return ()
        self.stats.extra["gang_jobs_finished"] += 1
        return [Outgoing(self.topics.jobs_events, event.job_id, encode(event))]

    def on_event(self, rec: Record) -> Sequence[Outgoing]:
        """A job's process failed on another node: stop its process here (a gang)."""
        try:
            ev = self._event.decode(rec.value or b"")
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_event"] += 1  # telemetry dead-letters it
            return ()
        if self.runner.stop_sibling(ev):
            self.stats.extra["stopped_with_sibling"] += 1
            log.info("stopping %s: its process on %s failed", ev.job_id, ev.node_ids)
            task = asyncio.create_task(self._escalate(ev.job_id))
            self.watchers.add(task)
            task.add_done_callback(self.watchers.discard)
        return ()

    async def on_kill(self, rec: Record) -> Sequence[Outgoing]:
        try:
            req = self._kill.decode(rec.value or b"")
        except msgspec.MsgspecError as exc:
            raise Reject(f"invalid KillRequest: {exc}", kind="invalid") from None
        if req.requeue:
            if not self.runner.preempt(req.job_id, req.reason):
                self.stats.extra["preempt_not_here"] += 1  # not running here (or stopping)
                return ()
            self.stats.extra["preemptions"] += 1
            log.info("preempting %s (%s)", req.job_id, req.reason or "no reason given")
            grace = req.grace_s if req.grace_s is not None else self.config.kill_grace_s
            task = asyncio.create_task(self._escalate(req.job_id, grace))
            self.watchers.add(task)
            task.add_done_callback(self.watchers.discard)
            return ()
        if not self.runner.kill(req.job_id, req.reason):
            self.stats.extra["kill_not_here"] += 1  # not running here: never start it here
            return await self._announce(self.runner.forbid(req.job_id, req.reason, time.time()), [])
        self.stats.extra["kills"] += 1
        log.info("killing %s on request (%s)", req.job_id, req.reason or "no reason given")
        task = asyncio.create_task(self._escalate(req.job_id))
        self.watchers.add(task)
        task.add_done_callback(self.watchers.discard)
        return ()

    def _time_up(self, started: Started) -> None:
        """A job ran its time limit: SIGTERM, then SIGKILL after the grace period."""
        if self.runner.running.get(started.job_id) is not started.process:
            return  # (ended meanwhile)
        if self.runner.time_up(started.job_id):
            self.stats.extra["time_limits"] += 1
            log.info("stopping %s: its time limit is reached", started.job_id)
            task = asyncio.create_task(self._escalate(started.job_id))
            self.watchers.add(task)
            task.add_done_callback(self.watchers.discard)

    async def _escalate(self, job_id: str, grace_s: float | None = None) -> None:
        """SIGKILL a job that has not stopped `grace_s` (`kill_grace_s`) after SIGTERM."""
        proc = self.runner.running.get(job_id)
        await asyncio.sleep(self.config.kill_grace_s if grace_s is None else grace_s)
        if proc is None or self.runner.running.get(job_id) is not proc:
            return  # it stopped (and may run again, a new process: not this one's to kill)
        if self.runner.kill(job_id, "", signal.SIGKILL):
            self.stats.extra["kills_escalated"] += 1

    def replay(self, rec: Record) -> None:
        """At start: learn job commands, and which jobs this node already started."""
        if rec.topic == self.topics.jobs_accepted:
            self._learn(rec)
        elif rec.topic == self.topics.jobs_events:
            with contextlib.suppress(msgspec.MsgspecError):
                ev = self._event.decode(rec.value or b"")
                if ev.kind == "started" and self.config.node_id in ev.node_ids:
                    self.runner.started.add(ev.job_id)
                elif ev.kind == "preempted" and self.config.node_id in ev.node_ids:
                    self.runner.started.discard(ev.job_id)  # back in the queue
                elif ev.kind in ("failed", "cancelled") and ev.job_id not in self.runner.started:
                    self.runner.forbid(ev.job_id, ev.detail, ev.time)  # ended unstarted
        elif rec.topic == self.topics.jobs_exits:
            with contextlib.suppress(msgspec.MsgspecError):
                self.runner.record_exit(self._exit.decode(rec.value or b""))

    def _learn(self, rec: Record) -> tuple[list[JobEvent], list[Started]]:
        try:
            return self.runner.learn(self._job.decode(rec.value or b""), time.time())
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_job"] += 1
            return [], []

    async def on_placements(self, rec: Record) -> Sequence[Outgoing]:
        try:
            batch = self._placements.decode(rec.value or b"")
        except msgspec.MsgspecError:
            self.stats.extra["ignored_bad_placement"] += 1
            return ()
        return await self._announce(*self.runner.place(batch, time.time()))

    async def _announce(self, events: list[JobEvent], procs: list[Started]) -> Sequence[Outgoing]:
        """Publish `events` (started, refused, failed to start), acknowledged, before the
        started processes are watched: a command that exits at once must not have its
        `finished` on the topic ahead of its `started` (consumers would take the job
        for running forever)."""
        self.stats.extra["jobs_waiting_for_command"] = len(self.runner.waiting)
        for e in events:
            await self._publish_reliably(self.topics.jobs_events, e.job_id, encode(e))
        for started in procs:
            task = asyncio.create_task(self._watch(started))
            self.watchers.add(task)
            task.add_done_callback(self.watchers.discard)
            limit = self.runner.limits.get(started.job_id)
            if limit is not None:
                timer = asyncio.get_running_loop().call_later(limit, self._time_up, started)
                task.add_done_callback(functools.partial(_cancel_timer, timer))
        self.stats.extra["jobs_started"] += len(procs)
        self.stats.extra["placements_refused"] += sum(
            1 for e in events if e.kind == "rejected_placement"
        )
        status = self.status() if events else None
        if status is None:
            return ()
        return [Outgoing(self.topics.cluster_nodes, status.node_id, encode(status))]

    async def _watch(self, started: Started) -> None:
        code = await asyncio.to_thread(started.process.wait)
        await asyncio.to_thread(self.runner.remove_swap, started.job_id)
        event = self.runner.exited(started.job_id, code, time.time())
        forget(started.job_id, self.config.node_id)  # its Prometheus series go with it
        # this node's share of a job of several nodes, or the job's own end
        topic = self.topics.jobs_exits if isinstance(event, NodeExit) else self.topics.jobs_events
        await self._publish_reliably(topic, event.job_id, encode(event))
        status = self.status()
        if status is not None:
            await self._publish(self.topics.cluster_nodes, status.node_id, encode(status))

    async def handle_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn = _Conn(writer)
        try:
            while line := await reader.readline():
                await self._from_process(conn, line)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if conn.job_id and self.jobs.get(conn.job_id) is conn:
                del self.jobs[conn.job_id]
            writer.close()

    async def _from_process(self, conn: _Conn, line: bytes) -> None:
        try:
            msg = ipc.decode(line, self.config.node_id)
        except msgspec.MsgspecError as exc:
            self.stats.extra["bad_local_messages"] += 1
            log.warning("bad message from a local process: %s", exc)
            return
        if isinstance(msg, ipc.Hello):
            conn.job_id = msg.job_id
            self.jobs[msg.job_id] = conn
        elif isinstance(msg, ipc.ProfileMsg):
            profile = msg.profile
            if not profile.node_id:
                profile = msgspec.structs.replace(profile, node_id=self.config.node_id)
            conn.profile_ms = int(time.time() * 1000)
            await self._publish(self.topics.offload_profiles, profile.job_id, encode(profile))
            self.stats.extra["profiles"] += 1
        elif isinstance(msg, ipc.StatsMsg):
            st = msg.stats
            if not st.node_id:
                st = msgspec.structs.replace(st, node_id=self.config.node_id)
            await self._publish(self.topics.offload_stats, st.job_id, encode(st))
            observe(st)
            self.stats.extra["stats"] += 1

    async def _publish(self, topic: str, key: str, value: bytes) -> None:
        fut = await self.producer.send(topic, key, value)
        await fut

    async def _publish_reliably(self, topic: str, key: str, value: bytes) -> None:
        """`_publish`, retried through a broker outage of up to `PUBLISH_GIVE_UP_S` (a
        job's events are its only record: none may be lost to a blip)."""
        delay, deadline = 0.1, time.monotonic() + PUBLISH_GIVE_UP_S
        while True:
            try:
                await self._publish(topic, key, value)
                return
            except (KafkaError, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise
                self.stats.extra["publish_retries"] += 1
                log.warning("publishing %s on %s: %s; retrying", key, topic, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def on_plan(self, rec: Record) -> Sequence[Outgoing]:
        """Bus handler for `offload.plans`: forward to the local process, if any."""
        try:
            plan = self._plan.decode(rec.value or b"")
        except msgspec.MsgspecError as exc:
            raise Reject(f"not a PrefetchPlan: {exc}") from exc
        conn = self.jobs.get(plan.job_id)
        if conn is None or rec.timestamp_ms + 1000 < conn.profile_ms:
            self.stats.extra["plans_not_local"] += 1
            return ()
        conn.writer.write(ipc.encode_line(ipc.PlanMsg(plan)))
        with contextlib.suppress(ConnectionError):
            await conn.writer.drain()
        self.stats.extra["plans_forwarded"] += 1
        return ()

    def status(self) -> NodeStatus | None:
        """This host now: pynvml where there is a GPU, else the configured inventory
        (None when it has neither); GPUs held by jobs started here are not free."""
        busy = self.runner.busy
        status = None if self.config.emulate else node_status(self.config.node_id)
        if status is not None:
            self.runner.gpus = status.gpus
            return msgspec.structs.replace(
                status, free_gpus=[g for g in status.free_gpus if g not in busy], source="pynvml"
            )
        if self.config.inventory is None:
            return None
        gpu_type, gpus = self.config.inventory
        return NodeStatus(
            node_id=self.config.node_id,
            gpu_type=gpu_type,
            gpus=gpus,
            free_gpus=[g for g in range(gpus) if g not in busy],
            gpu_util=len([g for g in busy if g < gpus]) / gpus,
            time=time.time(),
            source="inventory",
        )

    async def publish_status(self, stop: asyncio.Event) -> None:
        """NodeStatus every interval (see `status`)."""
        while not stop.is_set():
            status = self.status()
            if status is not None:
                await self._publish(self.topics.cluster_nodes, status.node_id, encode(status))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.status_interval_s)


def _cancel_timer(timer: asyncio.TimerHandle, _task: asyncio.Task[None]) -> None:
    timer.cancel()  # (the job ended before its time limit)


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
    config: AgentConfig | None = None,
) -> ServiceStats:
    config = config or AgentConfig.from_env()
    stats = ServiceStats()
    config.socket_path.unlink(missing_ok=True)  # a stale socket from a dead agent
    async with Producer(settings, client_id=f"{NAME}-{config.node_id}") as producer:
        agent = HostAgent(settings, config, producer, stats)
        server = await asyncio.start_unix_server(agent.handle_client, path=str(config.socket_path))
        t = settings.topics
        topics = [t.offload_plans, t.jobs_accepted, t.sched_placements, t.jobs_kill]
        spec = ServiceSpec(
            name=f"{NAME}.{config.node_id}",  # per node: each answers its own share
            group_id=group_id or f"{t.prefix}{NAME}.{config.node_id}",
            topics=[*topics, t.jobs_events, t.jobs_exits],
            handle=agent.on_record,
            replay_topics=[t.jobs_accepted, t.jobs_events, t.jobs_exits],
            replay=agent.replay,
        )

        async def status(s: serving.Serving) -> None:
            await agent.publish_status(s.stop)

        try:
            return await serving.serve(settings, spec, stop, ready, stats=stats, beside=[status])
        finally:
            server.close()
            await server.wait_closed()
            config.socket_path.unlink(missing_ok=True)
