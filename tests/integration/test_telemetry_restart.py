"""Telemetry restarted over a trace with preemptions, on the real broker: its figures
equal a reference computed from the events alone. A restarted telemetry reads its
inputs back from the beginning and then consumes from its committed offset: the
records in between must count once, or a preempted job's earlier start reopens the
segment it closed (a job shown running that waits, GPUs held twice, segments twice).

The events are a real run's: `rltune simulate` of the Philly slice on a small cluster
with two team guarantees (reclaim preempts borrowers), each per-job row turned into
`started` / `preempted` / `finished` events. The first telemetry reads the events up
to T1 and stops (committing them); then those up to T2 are published, T1 and T2 chosen
around a preempted job so that both its start and its stop come after the commit and
it is still unfinished at T2; a second telemetry reads everything back and consumes
the events after T1 live."""

from __future__ import annotations

import asyncio
import math
import statistics
from collections import Counter
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import msgspec

from rltune import main
from services.telemetry import service as telemetry
from shared.bus import Producer, Record, read_back
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.messages import Job, JobEvent, MetricsSnapshot, NodeStatus, encode
from shared.metrics import JobRecord
from shared.sim.jobs_out import read_jobs_csv
from tests.integration.streaming import SMALL_CLUSTER, services
from tests.paths import PHILLY

LIMIT = 60
QUEUES = 'queues:\n  "6214e9": {guaranteed_gpus: 6}\n  "b436b2": {guaranteed_gpus: 6}\n'


def _events(recs: list[JobRecord]) -> list[JobEvent]:
    """Each segment's start and stop, in time order (a stop before a start at one time)."""
    out = []
    for r in recs:
        for i, s in enumerate(r.segments):
            last = i == len(r.segments) - 1
            out.append(JobEvent(r.job_id, "started", s.start_s, ["n0"]))
            out.append(
                JobEvent(r.job_id, "finished" if last else "preempted", s.finish_s, ["n0"],
                         "" if last else "reclaim")
            )  # fmt: skip
    return sorted(out, key=lambda e: (e.time, e.kind == "started", e.job_id))


async def _snapshot(bus: BusSettings, want: dict[str, object]) -> MetricsSnapshot:
    """The latest `telemetry.all` snapshot once one counts the finished jobs of `want`
    (and, after a few more, the latest: the events still read meanwhile included)."""
    jobs = want["jobs"]
    for _ in range(300):
        await asyncio.sleep(0.2)
        recs: list[Record] = []
        await read_back(bus, [bus.topics.metrics], recs.append)
        snaps = [msgspec.json.decode(r.value or b"", type=MetricsSnapshot) for r in recs]
        mine = [s for s in snaps if s.source == "telemetry.all"]
        if mine and mine[-1].jobs == jobs:
            await asyncio.sleep(1.0)  # (and a few more snapshots after it)
            recs.clear()
            await read_back(bus, [bus.topics.metrics], recs.append)
            snaps = [msgspec.json.decode(r.value or b"", type=MetricsSnapshot) for r in recs]
            return [s for s in snaps if s.source == "telemetry.all"][-1]
    raise AssertionError(f"no snapshot with {jobs} jobs done")


def _reference(
    events: list[JobEvent], recs: list[JobRecord], queue: dict[str, str], gpus: int
) -> dict[str, object]:
    """The figures, from the events alone: each job's segments, its finish, the stops."""
    size = {r.job_id: r.num_gpus for r in recs}
    submit = {r.job_id: r.submit_s for r in recs}
    segs: dict[str, list[list[float]]] = {}
    finish: dict[str, float] = {}
    stops: Counter[str] = Counter()
    for e in events:
        if e.kind == "started":
            segs.setdefault(e.job_id, []).append([e.time, math.nan])
            continue
        segs[e.job_id][-1][1] = e.time
        if e.kind == "preempted":
            stops[queue[e.job_id]] += 1
        else:
            finish[e.job_id] = e.time
    running = [j for j, g in segs.items() if math.isnan(g[-1][1])]
    allocated: Counter[str] = Counter()
    for j in running:
        allocated[queue[j]] += size[j]
    lo = min(submit[j] for j in finish)  # (the summary's span: its finished jobs' submits)
    hi = max(submit[j] for j in finish)
    busy = sum(size[j] * max(0.0, min(b, hi) - max(a, lo)) for j in finish for a, b in segs[j])
    jct = {j: finish[j] - submit[j] for j in finish}
    run = {j: sum(b - a for a, b in segs[j]) for j in finish}
    return {
        "jobs": len(finish),
        "running": len(running),
        "avg_jct_s": statistics.mean(jct.values()),
        "avg_queue_s": statistics.mean(segs[j][0][0] - submit[j] for j in finish),
        "avg_bsld": statistics.mean(max(1.0, jct[j] / max(run[j], 10.0)) for j in finish),
        "gpu_util": busy / (gpus * (hi - lo)) if hi > lo else 0.0,
        "preemptions": {q: float(n) for q, n in stops.items()},
        "allocated": {q: float(g) for q, g in allocated.items()},
    }


def _figures(snap: MetricsSnapshot) -> dict[str, object]:
    """The same figures, from a snapshot."""
    qs = snap.queues
    return {
        "jobs": snap.jobs,
        "running": int(snap.counters["running"]),
        "avg_jct_s": snap.avg_jct_s,
        "avg_queue_s": snap.avg_queue_s,
        "avg_bsld": snap.avg_bsld,
        "gpu_util": snap.gpu_util,
        "preemptions": {q: r["preemptions"] for q, r in qs.items() if r.get("preemptions")},
        "allocated": {q: r["allocated_gpus"] for q, r in qs.items() if r["allocated_gpus"]},
    }


def _diff(got: dict[str, object], want: dict[str, object]) -> dict[str, tuple[object, object]]:
    """The figures that differ (floats: beyond rounding), as (got, want)."""
    out = {}
    for k in want:
        g, w = got.get(k), want[k]
        same = g == w or (
            isinstance(g, float) and isinstance(w, float) and math.isclose(g, w, rel_tol=1e-9)
        )
        if not same:
            out[k] = (g, w)
    return out


async def test_a_restarted_telemetry_counts_each_event_once(
    bus: BusSettings, tmp_path: Path
) -> None:
    cluster = tmp_path / "tenants.yaml"
    cluster.write_text(SMALL_CLUSTER + QUEUES)
    out = tmp_path / "jobs.csv"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster)]
    assert main([*argv, "--policy", "fifo", "--limit", str(LIMIT), "--jobs-out", str(out)]) == 0
    recs = [r for r in read_jobs_csv(out) if r.segments]  # (not the rejected)
    spec = load_cluster(cluster)
    gpus = sum(n.gpus for n in spec.nodes)
    queue = {r.job_id: spec.queue_of(r.vc) for r in recs}
    preempted = sorted(
        (r for r in recs if len(r.segments) > 1), key=lambda r: r.segments[0].finish_s
    )
    assert len(preempted) >= 3  # reclaim stopped borrowers
    # T1 just before a preempted job's first start (after some job finished); T2 while
    # it waits to run again
    done = min(r.segments[-1].finish_s for r in recs)
    p = next(
        r for r in preempted
        if r.segments[1].start_s > r.segments[0].finish_s and r.segments[0].start_s > done
    )  # fmt: skip
    t1 = p.segments[0].start_s - 0.5
    t2 = (p.segments[0].finish_s + p.segments[1].start_s) / 2
    events = _events(recs)
    first = [e for e in events if e.time < t1]
    upto = [e for e in events if e.time <= t2]
    assert first and len(upto) < len(events)
    assert p.job_id not in [e.job_id for e in first]
    t = bus.topics
    conf = telemetry.TelemetrySettings(interval_s=0.2, window_s=1e9, cluster=str(cluster))

    def run() -> AbstractAsyncContextManager[object]:
        return services(bus, {"telemetry": lambda stop: telemetry.serve(bus, stop, conf=conf)})

    async with Producer(bus) as prod:

        async def send(evs: list[JobEvent]) -> None:
            for e in evs:
                await prod.send(t.jobs_events, e.job_id, encode(e))
            await prod.flush()

        await prod.send(t.cluster_nodes, "n0", encode(NodeStatus("n0", "GPU", gpus, [])))
        for r in recs:
            job = Job(r.job_id, r.num_gpus, r.submit_s, vc=r.vc)
            await prod.send(t.jobs_accepted, r.job_id, encode(job))
        await send(first)
        async with run():  # the first telemetry: reads up to T1, commits, stops
            want = _reference(first, recs, queue, gpus)
            assert not _diff(_figures(await _snapshot(bus, want)), want)
        await send(upto[len(first) :])
        async with run():  # the second: everything read back, the events after T1 live
            want = _reference(upto, recs, queue, gpus)
            got = _figures(await _snapshot(bus, want))
            assert not _diff(got, want)
            await send(events[len(upto) :])  # the rest of the run, live
            want = _reference(events, recs, queue, gpus)
            got = _figures(await _snapshot(bus, want))
    assert want["jobs"] == len(recs) and want["running"] == 0
    assert not _diff(got, want)
