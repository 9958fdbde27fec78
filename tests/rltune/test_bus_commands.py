"""The bus commands as a user runs them: `up`, `submit --wait`, `metrics`, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.broker import EmbeddedBroker, free_port
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.metrics import summarize
from shared.sim import read_jobs_csv

CLUSTER = Path(__file__).resolve().parents[2] / "clusters" / "philly.yaml"
SAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "philly-2000.jsonl")


def rltune(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rltune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.integration  # starts a broker in a subprocess
def test_up_replays_the_sample_until_done(tmp_path: Path) -> None:
    """`up --until-done` (real time, each service its own process) schedules the
    whole sample slice and writes simulate's files: every job ran once, and the
    summary is the one recomputed from the per-job file."""
    out, jobs = tmp_path / "up.json", tmp_path / "up.csv"
    r = rltune(
        "up", "--trace", SAMPLE, "--limit", "200", "--speedup", "1e7", "--until-done",
        "--placer", "greedy",
        "--json", str(out), "--jobs-out", str(jobs), "--port", str(free_port()),
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    final = json.loads(out.read_text())
    assert final["jobs"] == 200 and final["rejected"] == {}
    assert final["settings"]["limit"] == 200 and final["settings"]["placer"] == "greedy"
    assert final["settings"]["time"] == "real time x1e+07"
    records = read_jobs_csv(jobs)
    assert len(records) == 200 and all(len(rec.segments) == 1 for rec in records)
    again = summarize(records, load_cluster(CLUSTER).total_gpus)
    assert again["avg_jct_s"] == final["avg_jct_s"]
    assert again["avg_queue_s"] == final["avg_queue_s"]


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
        (["up", "--trace", SAMPLE, "--speedup", "0"], "--speedup must be positive"),
        (["up", "--trace", SAMPLE, "--round-interval", "-5"], "--round-interval must be 0 or"),
        (["up", "--policy", "nope"], "unknown policy"),
        (["up", "--trace", SAMPLE, "--policy", "nope"], "unknown policy"),
        (["up", "--trace", "/nonexistent.csv", "--format", "philly"], "not found"),
        (["up", "--trace", SAMPLE, "--format", "nope"], "unknown trace format"),
        # the local cluster (no --trace) takes no replay flag, a replay no host count
        (["up", "--speedup", "10", "--until-done"], "--speedup, --until-done go with --trace"),
        (["up", "--trace", SAMPLE, "--hosts", "3"], "--hosts and --gpus size the local"),
        (["up", "--gpus", "0"], "not a positive"),
        (["up", "--cluster", "clusters/philly.yaml"], "--cluster go with --trace"),
        (["up", "--placer", "milp+offload"], "goes with --trace"),
        # the local cluster's team queues
        (["up", "--queues", "/nonexistent.yaml"], "cannot read --queues /nonexistent.yaml"),
        (["up", "--queues", "clusters/philly.yaml"], "a mapping of queues and priority_classes"),
        (["up", "--grace", "5"], "--grace and --min-run go with --queues"),
        (["up", "--queues", "q.yaml", "--min-run", "-1"], "--min-run must be within"),
        (["up", "--trace", SAMPLE, "--queues", "q.yaml"], "a replay takes its queues from"),
        (["up", "--trace", SAMPLE, "--grace", "-1"], "--grace must be a number of seconds"),
        (["up", "--checkpoint", "60"], "--checkpoint go with --trace"),
        (["submit", "--job-id", "x", "--num-gpus", "1", "--command", "a 'b"], "--command"),
        (["submit", "--job-id", "x", "--num-gpus", "1", "--command", " "], "--command is empty"),
        (["submit", "--job-id", "x", "--num-gpus", "1", "--wait", "done"], "invalid choice"),
        (["jobs", "--bootstrap", "nohostport"], "HOST:PORT"),
        (["submit", "--file", "/nonexistent.jsonl"], "cannot read"),
        (["submit", "--job-id", "x"], "--num-gpus"),
        (["submit", "--job-id", "bad id", "--num-gpus", "1"], "$.job_id"),
        (["submit", "--job-id", "x", "--num-gpus", "1", "--bootstrap", "nohostport"], "HOST:PORT"),
        (["service", "nope"], "invalid choice: 'nope'"),
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


def test_local_queues_beyond_the_local_hosts_are_refused_in_one_line(tmp_path: Path) -> None:
    queues = tmp_path / "q.yaml"
    queues.write_text("queues:\n  prod: {guaranteed_gpus: 9}\n")  # 2 hosts x 4 GPUs: 8
    r = rltune("up", "--queues", str(queues), timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "guaranteed_gpus add up to 9, more than the cluster's 8 GPUs" in line, line
