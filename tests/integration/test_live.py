"""Live mode: two host agents with configured inventories (no GPU), the real broker,
arrival, scoring, placement and telemetry; jobs whose commands are short real
processes run on the GPUs placement gave them, and their exit codes come back; a
long one is killed on request (`jobs.kill`), process group and all; a job still
waiting in the queue, and one whose kill came before its submission, are killed
without ever starting."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec

from offload_agent import agent
from rltune import main
from services.arrival import service as arrival
from services.placement import service as placement
from services.scoring import service as scoring
from services.telemetry import service as telemetry
from shared.bus import Producer, Record, read_back
from shared.config import BusSettings
from shared.messages import JobEvent, JobSpec, MetricsSnapshot, encode
from tests.integration.streaming import services

NODES = {"host-a": ("V100", 2), "host-b": ("P100", 4)}


def _job(tmp: Path, job_id: str, gpus: int, types: list[str], code: int = 0) -> JobSpec:
    """A job that writes its CUDA_VISIBLE_DEVICES to a file, then exits with `code`."""
    out = tmp / f"{job_id}.env"
    script = (
        f"import os, time; time.sleep(0.3); "
        f"open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES']); "
        f"raise SystemExit({code})"
    )
    return JobSpec(
        job_id=job_id, num_gpus=gpus, gpu_types=types, command=[sys.executable, "-c", script]
    )


async def _events(bus: BusSettings) -> list[JobEvent]:
    recs: list[Record] = []
    await read_back(bus, [bus.topics.jobs_events], recs.append)
    return [msgspec.json.decode(r.value or b"", type=JobEvent) for r in recs]


async def test_two_agents_run_placed_jobs_with_their_gpus(bus: BusSettings, tmp_path: Path) -> None:
    runs: dict[str, Callable[[asyncio.Event], Coroutine[Any, Any, Any]]] = {
        "arrival": lambda stop: arrival.serve(bus, stop),
        "scoring": lambda stop: scoring.serve(
            bus, stop, conf=scoring.ScoringSettings("fifo", rounds="free")
        ),
        "placement": lambda stop: placement.serve(bus, stop),
        "telemetry": lambda stop: telemetry.serve(
            bus, stop, conf=telemetry.TelemetrySettings(interval_s=0.5)
        ),
    }
    for node, inv in NODES.items():
        cfg = agent.AgentConfig(
            tmp_path / f"{node}.sock", node, status_interval_s=1.0, inventory=inv
        )
        runs[node] = functools.partial(agent.serve, bus, config=cfg)
    jobs = [
        _job(tmp_path, "v-two", 2, ["V100"]),
        _job(tmp_path, "p-three", 3, ["P100"]),
        _job(tmp_path, "p-fails", 1, ["P100"], code=3),
        _job(tmp_path, "any-two", 2, []),  # waits for GPUs to come back
    ]
    # a long job that starts a child of its own; both must go when it is killed
    pids = tmp_path / "sleeper.pids"
    script = (
        "import os, subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(600)"
    )
    sleeper = JobSpec(job_id="sleeper", num_gpus=1, command=[sys.executable, "-c", script])
    # every GPU of the cluster: it cannot start while the sleeper holds one
    whole = JobSpec(job_id="whole", num_gpus=6, command=[sys.executable, "-c", "0"])
    early = JobSpec(job_id="early", num_gpus=6, command=[sys.executable, "-c", "0"])

    def kill(job_id: str, reason: str) -> list[str]:
        argv = ["submit", "--kill", job_id, "--reason", reason]
        return [*argv, "--bootstrap", bus.bootstrap, "--topic-prefix", bus.topic_prefix]

    async with services(bus, runs):
        await asyncio.sleep(2.0)  # the agents report their inventories first
        async with Producer(bus) as p:
            assert await asyncio.to_thread(main, kill("early", "before")) == 0
            for spec in [sleeper, *jobs, whole, early]:
                await (await p.send(bus.topics.jobs_submit, spec.job_id, encode(spec)))
            for _ in range(240):  # once it runs (and has started its child), kill it
                if pids.exists() and len(pids.read_text().split()) == 2:
                    break
                await asyncio.sleep(0.5)
            assert await asyncio.to_thread(main, kill("whole", "queued")) == 0
            for _ in range(60):  # (killed first: with the sleeper gone it could start)
                if any(e.job_id == "whole" and e.kind == "cancelled" for e in await _events(bus)):
                    break
                await asyncio.sleep(0.5)
            assert await asyncio.to_thread(main, kill("sleeper", "test")) == 0
            await (await p.send(bus.topics.jobs_kill, "sleeper", b"{not json"))  # rejected
        ended: dict[str, JobEvent] = {}
        for _ in range(240):
            ended = {
                e.job_id: e
                for e in await _events(bus)
                if e.kind in ("finished", "failed", "cancelled")
            }
            if len(ended) == len(jobs) + 3:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.5)  # a snapshot after the last event
    events = await _events(bus)
    started = {e.job_id: e for e in events if e.kind == "started"}
    assert set(ended) == {j.job_id for j in jobs} | {"sleeper", "whole", "early"}
    assert ended["sleeper"].kind == "failed"
    assert ended["sleeper"].detail.startswith("killed on request (test); exit code")
    assert ended["whole"].kind == "cancelled" and "whole" not in started
    assert ended["whole"].detail == "killed while queued (queued)"
    assert "early" not in started  # never ran: (which of the two saw it first)
    assert (ended["early"].kind, ended["early"].detail) in (
        ("cancelled", "killed while queued (before)"),
        ("failed", "killed before it started (before)"),
    )
    for pid in map(int, pids.read_text().split()):  # the job and its child are gone
        assert not _alive(pid), pid
    rejected: list[Record] = []
    await read_back(bus, [bus.topics.jobs_rejected], rejected.append)
    assert any(b"invalid KillRequest" in (r.value or b"") for r in rejected)
    assert ended["p-fails"].kind == "failed" and ended["p-fails"].detail == "exit code 3"
    assert all(ended[j].kind == "finished" for j in ("v-two", "p-three", "any-two"))
    assert started["v-two"].node_ids == ["host-a"] and started["p-three"].node_ids == ["host-b"]
    for spec in jobs:  # (the sleeper ran wherever a GPU was free)
        ev = started[spec.job_id]
        gpus = ev.detail.split("gpus ")[1]
        assert (tmp_path / f"{spec.job_id}.env").read_text() == gpus  # CUDA_VISIBLE_DEVICES
        idx = [int(g) for g in gpus.split(",")]
        assert len(idx) == spec.num_gpus and max(idx) < NODES[ev.node_ids[0]][1]
    # no GPU held by two jobs at once: replay the events in order
    held: dict[tuple[str, int], str] = {}
    for e in events:
        if e.kind == "started":
            for g in e.detail.split("gpus ")[1].split(","):
                assert (e.node_ids[0], int(g)) not in held
                held[(e.node_ids[0], int(g))] = e.job_id
        elif e.kind in ("finished", "failed"):
            held = {k: v for k, v in held.items() if v != e.job_id}
    snaps: list[Record] = []
    await read_back(bus, [bus.topics.metrics], snaps.append)
    tel = [
        s
        for s in (msgspec.json.decode(r.value or b"", type=MetricsSnapshot) for r in snaps)
        if s.source == "telemetry.all"
    ]
    assert tel[-1].counters["done"] == 7 and tel[-1].counters["failed"] == 4
    assert tel[-1].counters["cancelled"] == 2 and tel[-1].jobs == 5  # JCTs: jobs that ran


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
