"""Live reclaim survives a restart of scoring, on the real broker with a real host agent
and real processes: two borrowers of `research` hold the host's four GPUs, a job of
`prod` (inside its guarantee) waits, scoring asks the newer borrower to stop, and is
SIGKILLed while that borrower (which ignores SIGTERM) is inside its grace period, then
started again. The reclaim is not lost (the owner starts on the GPUs the victim frees,
within grace + minimum run + a round, with the restart's own time on top), and nothing
doubles: scoring asks once, a second request (sent by the test, as a scoring that
decided again would) is ignored by the agent, one SIGTERM, one `preempted`, the older
borrower untouched."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shared.bus import Producer, Record, read_back
from shared.config import BusSettings
from shared.messages import KillRequest, encode
from tests.integration.processes import borrower_command, release_borrowers, stop_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 30.0  # longer than scoring takes to come back, so it comes back inside it
MIN_RUN_S = 2.0
ROUND_S = 5.0  # a round (ticks of 0.5 s, a placement, the agent's start), loaded machine
RESTART_S = 20.0  # a scoring process killed and started again, on a loaded machine
CLUSTER = """\
name: local
nodes:
  - {name: host, count: 1, gpu_type: GPU, gpus: 4}
queues:
  prod: {guaranteed_gpus: 4}
  research: {guaranteed_gpus: 0}
priority_classes:
  train: {priority: 10, preemptible: true}
"""


def _spawn(
    bus: BusSettings, argv: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "rltune", "service", *argv]
    cmd += ["--bootstrap", bus.bootstrap, "--topic-prefix", bus.topic_prefix]
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **env} if env else None,
        )  # fmt: skip


def _borrower(d: Path, name: str, ignores_term: bool) -> list[str]:
    return borrower_command(d, name, ignores_term, hold_s=600.0)


async def _records(bus: BusSettings, topic: str) -> list[dict[str, Any]]:
    recs: list[Record] = []
    await read_back(bus, [topic], recs.append)
    return [json.loads(r.value or b"{}") for r in recs]


async def _wait(bus: BusSettings, topic: str, pred: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hits = [r for r in await _records(bus, topic) if pred(r)]
        if hits:
            return hits[0]
        await asyncio.sleep(0.3)
    raise AssertionError(f"nothing on {topic} in {timeout} s: {await _records(bus, topic)}")


def _event(job: str, kind: str) -> Any:
    return lambda e: e.get("job_id") == job and e.get("kind") == kind


async def test_scoring_restarted_inside_a_reclaims_grace_period(
    bus: BusSettings, tmp_path: Path
) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    t = bus.topics
    scoring = ["scoring", "--policy", "fifo", "--rounds", "free", "--cluster", str(cluster)]
    scoring += ["--grace", str(GRACE_S), "--min-run", str(MIN_RUN_S)]
    host = {
        "RLTUNE_NODE_ID": "host-0",
        "RLTUNE_NODE_GPUS": "4",
        "RLTUNE_NODE_GPU_TYPE": "GPU",
        "RLTUNE_NODE_EMULATE": "1",
        "RLTUNE_OFFLOAD_SOCKET": str(tmp_path / "host.sock"),
        "RLTUNE_SWAP_DIR": str(tmp_path / "swap"),
        "RLTUNE_JOB_LOGS": str(tmp_path / "jobs"),
    }
    procs = {
        "arrival": _spawn(bus, ["arrival", "--cluster", str(cluster)], tmp_path / "arrival.log"),
        "scoring": _spawn(bus, scoring, tmp_path / "scoring.log"),
        "placement": _spawn(bus, ["placement"], tmp_path / "placement.log"),
        "agent": _spawn(bus, ["offload-agent"], tmp_path / "agent.log", host),
    }
    try:
        async with Producer(bus) as prod:

            async def submit(spec: dict[str, Any]) -> float:
                await (await prod.send(t.jobs_submit, spec["job_id"], json.dumps(spec).encode()))
                return time.time()

            for name, ignores in (("b1", False), ("b2", True)):
                await submit({"job_id": name, "vc": "research", "num_gpus": 2,
                              "priority_class": "train",
                              "command": _borrower(tmp_path, name, ignores)})  # fmt: skip
                await _wait(bus, t.jobs_events, _event(name, "started"), 120)
            await asyncio.sleep(MIN_RUN_S)
            asked = await submit(
                {
                    "job_id": "owner",
                    "vc": "prod",
                    "num_gpus": 2,
                    "command": [sys.executable, "-c", "0"],
                }
            )
            # scoring asks b2 (the newest borrower) to stop: kill scoring inside b2's grace
            kill = await _wait(bus, t.jobs_kill, lambda k: k.get("requeue"), 60)
            assert kill["job_id"] == "b2", kill
            os.kill(procs["scoring"].pid, signal.SIGKILL)
            procs["scoring"].wait()
            procs["scoring"] = _spawn(bus, scoring, tmp_path / "scoring.log")
            # a second request for b2 while it stops (as a scoring that decided again
            # would send): the agent, already stopping it, ignores it
            again = KillRequest("b2", "a second request", requeue=True, grace_s=1.0)
            await (await prod.send(t.jobs_kill, "b2", encode(again)))
            stop = await _wait(bus, t.jobs_events, _event("b2", "preempted"), GRACE_S + 60)
            first = await _wait(bus, t.jobs_events, _event("owner", "started"), 60)
            await _wait(bus, t.jobs_events, _event("owner", "finished"), 60)
            await _wait(bus, t.jobs_events, _event("b2", "finished"), 90)
            await asyncio.sleep(2.0)  # (a second stop request would have come by now)
            events = await _records(bus, t.jobs_events)
            kills = [k for k in await _records(bus, t.jobs_kill) if k.get("requeue")]
    finally:
        stop_all(procs.values())
        release_borrowers(tmp_path)  # b1 outlives the agent; the test ends it
    log = (tmp_path / "scoring.log").read_text()
    assert log.count("preempting b2") == 1, log  # the second scoring did not ask again
    # the restart did not lose the reclaim: the owner started on b2's GPUs, within grace
    # + minimum run + a round of its submission (and the restart's time on top)
    assert stop["exit_code"] == -9, stop  # b2 ignored SIGTERM: killed after its grace
    # ... the first request's (30 s), not the second's (1 s): that one was ignored
    assert stop["time"] - float((tmp_path / "b2.term").read_text()) >= GRACE_S - 1.0
    assert first["time"] >= stop["time"]
    assert first["time"] - asked <= GRACE_S + MIN_RUN_S + ROUND_S + RESTART_S, (first, asked)
    # nothing doubled: one request, one SIGTERM, one `preempted`, b1 never stopped
    assert [(k["job_id"], k["reason"]) for k in kills] == [
        ("b2", "reclaim: queue prod's guarantee, for owner"),
        ("b2", "a second request"),  # (the test's own)
    ], kills
    assert len((tmp_path / "b2.term").read_text().splitlines()) == 1
    kinds = {j: [e["kind"] for e in events if e["job_id"] == j] for j in ("b1", "b2", "owner")}
    assert kinds == {
        "b1": ["started"],
        "b2": ["started", "preempted", "started", "finished"],
        "owner": ["started", "finished"],
    }, kinds
    assert not (tmp_path / "b1.term").exists()
