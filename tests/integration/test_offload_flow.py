"""10Cache end to end on the real broker: a training process publishes its profile
through the host agent, the profiler service answers with a plan, the process
applies it, and the figures it measured arrive on `offload.stats`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import msgspec

from offload_agent import agent
from services.profiler import service as profiler
from shared.bus import Producer, Record, read_back
from shared.config import BusSettings
from shared.messages import (
    Assignment,
    Job,
    JobEvent,
    OffloadStats,
    PlacementBatch,
    PrefetchPlan,
    TensorProfile,
    encode,
)

JOB = "itest-gpt-1"
NODE = "node-itest"


async def _wait_for(
    bus: BusSettings, topic: str, key: str, timeout_s: float = 60, want: str = ""
) -> Record:
    """The last record keyed `key` on `topic` (containing `want`, when given)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    found: list[Record] = []

    def keep(r: Record) -> None:
        if r.key == key.encode() and want.encode() in (r.value or b""):
            found.append(r)

    while True:
        await read_back(bus, [topic], keep)
        if found:
            return found[-1]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"nothing keyed {key} on {topic} in {timeout_s} s")
        await asyncio.sleep(0.5)


async def test_profile_plan_apply_stats(bus: BusSettings, tmp_path: Path) -> None:
    stop = asyncio.Event()
    ready_p, ready_a = asyncio.Event(), asyncio.Event()
    sock = tmp_path / "agent.sock"
    cfg = agent.AgentConfig(socket_path=sock, node_id=NODE)
    tasks = [
        asyncio.create_task(profiler.serve(bus, stop, ready_p)),
        asyncio.create_task(agent.serve(bus, stop, ready_a, config=cfg)),
    ]
    await asyncio.wait_for(asyncio.gather(ready_p.wait(), ready_a.wait()), 30)
    try:
        stats_file = tmp_path / "stats.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "offload_agent.examples.train_gpt",
            "--job-id", JOB, "--steps", "4", "--layers", "2", "--dim", "128",
            "--fast-mib", "4", "--host-mib", "0.5", "--swap-dir", str(tmp_path / "swap"),
            "--agent-socket", str(sock), "--stats-out", str(stats_file),
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 180)
        log = err.decode()
        assert proc.returncode == 0, log
        assert "plan v1 applied" in log, log

        profile = msgspec.json.decode(
            (await _wait_for(bus, bus.topics.offload_profiles, JOB)).value or b"",
            type=TensorProfile,
        )
        assert profile.node_id == NODE and profile.order and profile.fast_budget_bytes == 4 * 2**20
        plan = msgspec.json.decode(
            (await _wait_for(bus, bus.topics.offload_plans, JOB)).value or b"", type=PrefetchPlan
        )
        assert plan.version == 1 and set(plan.placement) == {t[0] for t in profile.tensors}
        got = msgspec.json.decode(
            (await _wait_for(bus, bus.topics.offload_stats, JOB)).value or b"", type=OffloadStats
        )
        # the process writes its figures without a node id (its agent fills it in)
        written = msgspec.json.decode(stats_file.read_bytes())
        assert written["node_id"] == ""
        assert got == msgspec.convert({**written, "node_id": NODE}, OffloadStats)
        assert got.hit_rate > 0.5 and got.bytes_in > 0 and got.step_ms > 0
    finally:
        stop.set()
        done = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert done[0].extra["plans"] == 1
    assert done[1].extra["plans_forwarded"] == 1 and done[1].extra["stats"] == 1


async def test_agent_runs_the_jobs_placed_on_its_node(bus: BusSettings, tmp_path: Path) -> None:
    """A placement on this node starts the job's command with its GPUs, even when it
    arrives before the job's accepted record; one on another node does not; one
    whose command never arrives waits (nothing is published for it)."""
    stop, ready = asyncio.Event(), asyncio.Event()
    cfg = agent.AgentConfig(socket_path=tmp_path / "a.sock", node_id=NODE)
    task = asyncio.create_task(agent.serve(bus, stop, ready, config=cfg))
    out = tmp_path / "ran.txt"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])"
    try:
        await asyncio.wait_for(ready.wait(), 30)
        t = bus.topics
        jobs = [
            Job("run-me", 2, 0.0, command=[sys.executable, "-c", code]),
            Job("not-mine", 1, 0.0, command=[sys.executable, "-c", "raise SystemExit(9)"]),
        ]
        batch = PlacementBatch(
            round_id=1,
            time=0.0,
            assignments=[
                Assignment("run-me", NODE, [1, 3]),
                Assignment("not-mine", "other-node", [0]),
                Assignment("no-command", NODE, [0]),
            ],
        )
        async with Producer(bus) as p:
            await (await p.send(t.sched_placements, "1", encode(batch)))
            await asyncio.sleep(1.0)  # the placement is seen first
            for job in jobs:
                await (await p.send(t.jobs_accepted, job.job_id, encode(job)))
        finished = await _wait_for(bus, t.jobs_events, "run-me", want="finished")
    finally:
        stop.set()
        stats = await asyncio.wait_for(task, 30)
    assert out.read_text() == "1,3"
    ev = msgspec.json.decode(finished.value or b"", type=JobEvent)
    assert ev.node_ids == [NODE] and ev.detail == "exit code 0"
    others: list[Record] = []
    await read_back(bus, [bus.topics.jobs_events], others.append)
    assert {r.key for r in others} == {b"run-me"}  # started + finished, nothing else
    assert stats.extra["jobs_waiting_for_command"] == 1
