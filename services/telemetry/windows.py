"""What telemetry knows of a run, and the figures it reports (pure: no bus).

Jobs come from `jobs.accepted`, their run segments from `jobs.events`, the
cluster's size and free GPUs from `cluster.nodes`, solves from
`sched.placements`, offload figures from `offload.stats`, rejections from
`jobs.rejected` and the dead-letter topics. Everything is keyed (job id, round
id, the position of a rejection), so a message read twice counts once.

Figures (`snapshot`): the DESIGN.md metric keys computed by `shared.metrics.summarize`
(the function `rltune simulate` uses) over two windows of the message clock
(virtual time in simulation, epoch seconds live): `all` (every finished job)
and `last:<N>s` (jobs that finished in the last N seconds), plus counters:
jobs waiting / running / done (and `ahead`: accepted with a submit time after the
cluster's clock, as a replay that publishes faster than the simulated cluster
runs produces; they are not in its queue yet, so they are not `waiting`),
utilisation now per GPU type, rounds and throughput, placement latency,
rejections, offload hit rate and migration latency. `reward` turns the last
window into a `Reward` (see `Reward.parts`).

Per queue (`queues`, given the cluster file's queues; each VC is a queue of its own
without one): pending jobs (accepted, not started, submitted by the cluster's clock),
GPUs held per GPU type, GPUs borrowed (held beyond the guarantee, `shared.tenancy`;
only where the cluster file has queues), preemptions by reason, and the fair-share
factor from the usage decayed with the cluster's half-life (`shared.fairshare`, kept
here from the events as the simulator keeps it).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.cluster import ClusterSpec
from shared.fairshare import FairShare, queue_key
from shared.messages import (
    Job,
    JobEvent,
    MetricsSnapshot,
    NodeStatus,
    OffloadStats,
    PlacementBatch,
    Reward,
)
from shared.metrics import JobRecord, Segment, percentile, summarize
from shared.placement_api import FULL_GPU
from shared.tenancy import Quota, Usage

__all__ = ["JobState", "RewardWeights", "Telemetry"]


AGENT_START = "pid "  # a host agent's `started` detail: "pid P gpus 0,1"


@dataclass(frozen=True)
class RewardWeights:
    """value = -bsld + hit_rate_weight × hit rate − migration_weight × migration p99 (s)
    over the window's finished jobs and the offload figures of its running jobs."""

    hit_rate: float = 1.0
    migration_s: float = 1.0


@dataclass
class JobState:
    job: Job
    segments: list[Segment] = field(default_factory=list)
    open_start: float | None = None
    open_types: str = ""
    open_nodes: str = ""
    open_node_ids: tuple[str, ...] = ()
    # (kind, time) of the events the per-queue figures counted: a record read twice
    # (read back at start, then consumed) counts once
    counted: set[tuple[str, float]] = field(default_factory=set)
    open_restart: float = 0.0  # a moved job's restore (its MoveOrder's restart_s)
    done: bool = False
    failed: bool = False


class Telemetry:
    def __init__(
        self,
        window_s: float = 3600.0,
        weights: RewardWeights | None = None,
        cluster: ClusterSpec | None = None,
    ) -> None:
        self.cluster = cluster
        self.fair = FairShare(cluster)
        self.preemptions: Counter[tuple[str, str]] = Counter()  # (queue, reason)
        self.window_s = window_s
        self.weights = weights or RewardWeights()
        self.jobs: dict[str, JobState] = {}
        self.nodes: dict[str, NodeStatus] = {}
        self.early: dict[str, list[JobEvent]] = {}  # events of jobs not accepted yet
        # called after each event applied to a known job (held ones when it is accepted),
        # with the job's (open start, done, ran a segment) before it: the service's
        # Prometheus histograms and counters
        self.on_event: Callable[[JobState, JobEvent, tuple[float | None, bool, bool]], None]
        self.on_event = lambda js, ev, before: None
        self.solves: dict[int, float] = {}  # round_id -> solver ms
        self.offload: dict[str, OffloadStats] = {}  # latest per job
        # moves issued and not yet seen started: job -> (time of the move, restart_s)
        self.move_cost: dict[str, tuple[float, float]] = {}
        self.rejected: Counter[str] = Counter()  # by topic
        self._rejections: set[str] = set()
        self.finished_at: list[tuple[float, str]] = []
        self.now = 0.0  # the cluster's clock: the latest event or node status time
        self.counts: Counter[str] = Counter()

    # ---- inputs -------------------------------------------------------------------------
    def accepted(self, job: Job) -> None:
        if job.job_id not in self.jobs:
            self.jobs[job.job_id] = JobState(job)
            for ev in self.early.pop(job.job_id, []):
                self.event(ev)

    def event(self, ev: JobEvent) -> None:
        js = self.jobs.get(ev.job_id)
        self.now = max(self.now, ev.time)
        if js is None:  # read before the job's accepted record (another topic)
            self.early.setdefault(ev.job_id, []).append(ev)
            return
        before = (js.open_start, js.done, bool(js.segments))
        self._event(js, ev)
        self.on_event(js, ev, before)

    def _event(self, js: JobState, ev: JobEvent) -> None:
        if js.done:
            return
        if (
            ev.kind == "started"
            and js.open_start is not None
            and ev.detail != js.open_nodes
            and not ev.detail.startswith(AGENT_START)
        ):
            # a move (MoveOrder): its segment ends, one on the new GPUs begins. (Host
            # agents never move a job, and each reports its own node's start of a job
            # given several: those are one segment.)
            self._close(js, ev.time)
            self.counts["moves"] += 1
            at, cost = self.move_cost.pop(ev.job_id, (ev.time, 0.0))
            js.open_restart = cost if at == ev.time else 0.0
        if ev.kind == "started" and js.open_start is None:
            if self._first(js, ev):
                self.fair.change(js.job.vc, ev.time, _gpus(js.job))
            js.open_start = ev.time
            js.open_nodes = ev.detail
            js.open_node_ids = tuple(ev.node_ids)
            js.open_types = "+".join(
                sorted({self.nodes[n].gpu_type for n in ev.node_ids if n in self.nodes})
            )
        elif ev.kind in ("finished", "failed", "preempted") and js.open_start is not None:
            if self._first(js, ev):
                self.fair.change(js.job.vc, ev.time, -_gpus(js.job))
                if ev.kind == "preempted":
                    q = self.queue_of(js.job)
                    self.preemptions[(q, preemption_reason(ev.detail))] += 1
            self._close(js, ev.time)
            if ev.kind != "preempted":
                js.done = True
                js.failed = ev.kind == "failed"
                self.finished_at.append((ev.time, ev.job_id))
        elif ev.kind in ("failed", "cancelled") and js.open_start is None:  # never ran
            js.done = js.failed = True
            self.counts["cancelled"] += 1
        elif ev.kind == "rejected_placement":
            self.counts["rejected_placement"] += 1

    @staticmethod
    def _first(js: JobState, ev: JobEvent) -> bool:
        """Whether the per-queue figures see `ev` for the first time."""
        key = (ev.kind, ev.time)
        if key in js.counted:
            return False
        js.counted.add(key)
        return True

    def _close(self, js: JobState, t: float) -> None:
        restart = min(js.open_restart, max(t - (js.open_start or 0.0), 0.0))
        js.segments.append(
            Segment(js.open_start or 0.0, t, js.open_types, js.open_nodes, restart_s=restart)
        )
        js.open_start, js.open_restart = None, 0.0

    def node(self, status: NodeStatus) -> None:
        self.nodes[status.node_id] = status
        self.now = max(self.now, status.time)

    def placement(self, batch: PlacementBatch) -> None:
        if batch.solver_status != "REPLACE":  # a driven re-placement round solves nothing
            self.solves[batch.round_id] = batch.solver_ms
        for mv in batch.moves:  # read before or after the executor's `started` (or finish)
            js = self.jobs.get(mv.job_id)
            if js is not None and js.open_start == batch.time and js.segments:
                js.open_restart = mv.restart_s
                continue
            done = [i for i, g in enumerate(js.segments) if g.start_s == batch.time] if js else []
            if js is not None and done and done[-1] > 0:
                g = js.segments[done[-1]]
                restart = min(mv.restart_s, g.finish_s - g.start_s)
                js.segments[done[-1]] = dataclasses.replace(g, restart_s=restart)
            else:
                self.move_cost[mv.job_id] = (batch.time, mv.restart_s)

    def offload_stats(self, stats: OffloadStats) -> None:
        self.offload[stats.job_id] = stats

    def rejection(self, topic: str, position: str) -> None:
        if position not in self._rejections:
            self._rejections.add(position)
            self.rejected[topic] += 1

    # ---- figures ------------------------------------------------------------------------
    def records(self, since: float | None = None) -> list[JobRecord]:
        out = []
        for js in self.jobs.values():
            if not js.done or not js.segments:  # (a job killed before it ever ran)
                continue
            if since is not None and js.segments[-1].finish_s < since:
                continue
            j = js.job
            milli = j.gpu_milli if j.num_gpus == 1 else FULL_GPU
            out.append(
                JobRecord(j.job_id, j.vc, j.submit_time, j.num_gpus, milli, tuple(js.segments))
            )
        return out

    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values())

    def util_by_type(self) -> dict[str, float]:
        total: dict[str, float] = {}
        used: dict[str, float] = {}
        for n in self.nodes.values():
            free = sum(n.free_milli) / FULL_GPU if n.free_milli is not None else len(n.free_gpus)
            total[n.gpu_type] = total.get(n.gpu_type, 0.0) + n.gpus
            used[n.gpu_type] = used.get(n.gpu_type, 0.0) + n.gpus - free
        return {t: used[t] / total[t] for t in sorted(total) if total[t]}

    def offload_figures(self) -> dict[str, float]:
        live = [
            s
            for jid, s in self.offload.items()
            if (js := self.jobs.get(jid)) is None or not js.done
        ] or list(self.offload.values())
        if not live:
            return {}
        return {
            "offload_jobs": float(len(live)),
            "offload_hit_rate": sum(s.hit_rate for s in live) / len(live),
            "offload_migration_ms_p50": percentile([s.migration_ms_p50 for s in live], 50),
            "offload_migration_ms_p99": max(s.migration_ms_p99 for s in live),
        }

    def counters(self) -> dict[str, float]:
        waiting = running = done = failed = ahead = 0
        for js in self.jobs.values():
            if js.done:
                done += 1
                failed += js.failed
            elif js.open_start is not None:
                running += 1
            elif js.job.submit_time > self.now:
                ahead += 1
            else:
                waiting += 1
        solves = list(self.solves.values())
        out: dict[str, float] = {
            "waiting": waiting,
            "ahead": ahead,
            "running": running,
            "done": done,
            "failed": failed,
            "rounds": len(solves),
            "rejected_placement": self.counts["rejected_placement"],
            "moves": self.counts["moves"],
            "cancelled": self.counts["cancelled"],
            "rejected_total": float(sum(self.rejected.values())),
            "placement_solve_p50_ms": percentile(solves, 50) if solves else 0.0,
            "placement_solve_p99_ms": percentile(solves, 99) if solves else 0.0,
            "clock_s": self.now,
            "window_s": self.window_s,
        }
        out.update({f"util_{t}": u for t, u in self.util_by_type().items()})
        out.update(self.offload_figures())
        recent = sum(1 for t, _ in self.finished_at if t >= self.now - self.window_s)
        out["throughput_per_h"] = recent * 3600.0 / self.window_s
        return out

    def queue_of(self, job: Job) -> str:
        return queue_key(self.cluster, job.vc)

    def queues(self) -> dict[str, dict[str, float]]:
        """Per queue: `pending_jobs` (its own jobs), `allocated_gpus` and
        `allocated_gpus.<type>` (a team's count to its org as well),
        `borrowed_gpus` (with the cluster file's queues), `preemptions` and
        `preemptions.<reason>`, `fair_share`."""
        out: dict[str, dict[str, float]] = {}

        def row(q: str) -> dict[str, float]:
            r = out.get(q)
            if r is None:
                r = out[q] = {"pending_jobs": 0.0, "allocated_gpus": 0.0}
            return r

        quota = Quota(self.cluster.queues if self.cluster is not None else {})
        usage = Usage(quota)  # a team's GPUs count to its org as well
        for js in self.jobs.values():
            if js.done:
                continue
            q = self.queue_of(js.job)
            row(q)
            if js.open_start is not None:
                # the types of its nodes as known now (a start may be read before them)
                types = {self.nodes[n].gpu_type for n in js.open_node_ids if n in self.nodes}
                t = js.open_types or "+".join(sorted(types)) or "unknown"
                usage.add(q, {t: _gpus(js.job)})
            elif js.job.submit_time <= self.now:
                row(q)["pending_jobs"] += 1
        for q, by_type in usage.by_type.items():
            r = row(q)
            r["allocated_gpus"] = sum(by_type.values())
            for t, g in by_type.items():
                r[f"allocated_gpus.{t}"] = g
        if self.cluster is not None and self.cluster.queues:
            for q in self.cluster.queues:
                row(q)["borrowed_gpus"] = quota.borrowed(usage, q)
        for (q, reason), n in self.preemptions.items():
            r = row(q)
            r["preemptions"] = r.get("preemptions", 0.0) + n
            r[f"preemptions.{reason}"] = float(n)
        for q, f in self.fair.factors(self.now).items():
            row(q)["fair_share"] = f
        for r in out.values():
            r.setdefault("fair_share", 1.0)
        return out

    def snapshot(self, wall: float, window: str = "all") -> MetricsSnapshot:
        since = None if window == "all" else self.now - self.window_s
        s = summarize(self.records(since), self.total_gpus(), list(self.solves.values()))
        return MetricsSnapshot(
            window=window,
            time=wall,
            jobs=int(s["jobs"]),  # type: ignore[call-overload]
            avg_jct_s=_num(s["avg_jct_s"]),
            p50_jct_s=_num(s["p50_jct_s"]),
            p99_jct_s=_num(s["p99_jct_s"]),
            avg_queue_s=_num(s["avg_queue_s"]),
            p99_queue_s=_num(s["p99_queue_s"]),
            avg_bsld=_num(s["avg_bsld"]),
            gpu_util=_num(s["gpu_util"]),
            makespan_s=_num(s["makespan_s"]),
            placement_p50_ms=_num(s["placement_p50_ms"]),
            placement_p99_ms=_num(s["placement_p99_ms"]),
            rejected={k: int(v) for k, v in self.rejected.items()},
            counters=self.counters(),
            queues=self.queues() if window == "all" else {},
            source=f"telemetry.{window}",  # the service's own counters are "telemetry"
        )

    def reward(self) -> Reward:
        window = f"last:{self.window_s:g}s"
        recs = self.records(self.now - self.window_s)
        bsld = summarize(recs, self.total_gpus())["avg_bsld"] if recs else 1.0
        parts = {"avg_bsld": _num(bsld), "jobs": float(len(recs))}
        parts.update(self.offload_figures())
        hit = parts.get("offload_hit_rate", 0.0)
        mig_s = parts.get("offload_migration_ms_p99", 0.0) / 1e3
        value = -parts["avg_bsld"] + self.weights.hit_rate * hit - self.weights.migration_s * mig_s
        return Reward(window=f"{window}@{self.now:g}", value=value, parts=parts)


PREEMPTION_REASONS = ("reclaim", "priority", "las", "kill")


def preemption_reason(detail: str) -> str:
    """The `reason` label of a preemption: the first word of its event's detail when
    it is a known reason (the simulator's `priority`, `reclaim`, `las`), or the first
    word inside the parentheses of a host agent's `preempted (priority: class high of
    hi); exit code 143`; `unspecified` when there is none, else `other` (a label must
    not take free text)."""
    text = detail.strip().lower()
    if text.startswith("preempted (") and ")" in text:
        text = text[len("preempted (") : text.index(")")]
    word = text.split(" ", 1)[0].split(":", 1)[0].split(";", 1)[0]
    if not word:
        return "unspecified"
    return word if word in PREEMPTION_REASONS else "other"


def _gpus(job: Job) -> float:
    return job.num_gpus * job.gpu_milli / FULL_GPU


def _num(v: object) -> float:
    f = float(v)  # type: ignore[arg-type]
    return f if f == f else 0.0  # NaN (no job yet) reads as 0
