"""The bus commands as a user runs them: `up`, `submit --wait`, `metrics`, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.broker import EmbeddedBroker, free_port
from shared.config import BusSettings


def rltune(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_up_replays_the_sample_until_done(tmp_path: Path) -> None:
    out = tmp_path / "up.json"
    r = rltune(
        "up", "--limit", "200", "--speedup", "1e7", "--until-done",
        "--json", str(out), "--port", str(free_port()),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    final = json.loads(out.read_text())
    assert final["submitted"] == 200
    assert final["answered"] == 200
    assert final["sources"]["arrival"]["counters"]["accepted"] == 200


async def test_submit_wait_and_metrics(
    bus: BusSettings, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    import asyncio

    from services.arrival import service as arrival

    env = {"RLTUNE_BOOTSTRAP_SERVERS": broker.bootstrap, "RLTUNE_TOPIC_PREFIX": bus.topic_prefix}
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    await asyncio.wait_for(ready.wait(), 30)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        '{"job_id": "a", "num_gpus": 2}\n{"job_id": "b", "num_gpus": 1, "gpu_milli": 250}\n'
    )
    r = await asyncio.to_thread(rltune, "submit", "--file", str(jobs), "--wait", env=env)
    assert r.returncode == 0, r.stderr
    assert "a: accepted" in r.stdout and "b: accepted" in r.stdout
    r = await asyncio.to_thread(
        rltune, "submit", "--job-id", "a", "--num-gpus", "2", "--wait", env=env
    )
    assert r.returncode == 1
    assert "a: rejected: job_id 'a' duplicates a live job" in r.stdout
    await asyncio.sleep(2.5)  # one metrics interval
    r = await asyncio.to_thread(rltune, "metrics", "--json", env=env)
    assert r.returncode == 0, r.stderr
    snaps = [json.loads(line) for line in r.stdout.splitlines()]
    arrival_snaps = [s for s in snaps if s.get("source") == "arrival"]
    assert arrival_snaps and arrival_snaps[-1]["counters"]["accepted"] == 2
    stop.set()
    await task


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--speedup", "0"], "--speedup must be positive"),
        (["up", "--lockstep"], "cluster-sim"),
        (["up", "--trace", "/nonexistent.csv", "--format", "philly"], "not found"),
        (["up", "--format", "nope"], "unknown trace format"),
        (["submit", "--file", "/nonexistent.jsonl"], "cannot read"),
        (["submit", "--job-id", "x"], "--num-gpus"),
        (["submit", "--job-id", "bad id", "--num-gpus", "1"], "$.job_id"),
        (["submit", "--job-id", "x", "--num-gpus", "1", "--bootstrap", "nohostport"], "HOST:PORT"),
        (["service", "nope"], "no service 'nope'"),
        (["bench", "nope"], "no benchmark 'nope'"),
        (["nope"], "invalid choice"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    r = rltune(*args, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
