"""A job placed on several hosts has one status decided by all of them: `rltune up`
(its broker, every service and two host agents of four emulated GPUs) runs 8-GPU jobs,
which need both agents, published by a stock Kafka client. `finished` comes once,
after the process on every host has exited 0; `failed` comes as soon as one fails,
naming that host and its exit code, and the other host's process is stopped; a kill
stops both."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_user_jobs import Up

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(420),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # kafka-python's importlib use
]

ENDS = ("finished", "failed", "cancelled")

# Each host's process: the first node of RLTUNE_JOB_NODES is the "slow" one. It writes
# <dir>/<node>.done with its exit time just before it exits with CODES[role].
SCRIPT = """
import os, sys, time
node, nodes = os.environ["RLTUNE_NODE_ID"], os.environ["RLTUNE_JOB_NODES"].split(",")
role = "first" if node == nodes[0] else "other"
out, codes, sleeps = sys.argv[1], {codes}, {sleeps}
open(os.path.join(out, node + ".pid"), "w").write(str(os.getpid()))
time.sleep(sleeps[role])
if codes[role]:
    print("boom on", node, file=sys.stderr)
open(os.path.join(out, node + ".done"), "w").write(repr(time.time()))
sys.exit(codes[role])
"""


def _job(job_id: str, out: Path, codes: dict[str, int], sleeps: dict[str, float]) -> dict[str, Any]:
    out.mkdir()
    code = SCRIPT.format(codes=codes, sleeps=sleeps)
    return {"job_id": job_id, "num_gpus": 8, "command": [sys.executable, "-c", code, str(out)]}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Up]:
    up = Up(tmp_path)  # no --trace: two hosts of four emulated GPUs
    try:
        yield up
    finally:
        up.stop()


def _ends(up: Up, job_id: str) -> list[dict[str, Any]]:
    return [e for e in up.events(job_id) if e["kind"] in ENDS]


def test_a_job_on_two_hosts_has_one_status_decided_by_both(local: Up, tmp_path: Path) -> None:
    # ---- both exit 0, one 4 s after the other: one `finished`, after the later exit
    out = tmp_path / "both"
    local.publish(_job("both", out, {"first": 0, "other": 0}, {"first": 4.0, "other": 0.0}))
    end = local.wait("ended", "both", timeout=180)
    starts = [e for e in local.events("both") if e["kind"] == "started"]
    nodes = sorted(n for e in starts for n in e["node_ids"])
    assert len(nodes) == 2 and len(set(nodes)) == 2, starts  # one process on each host
    assert (end["kind"], end.get("exit_code")) == ("finished", 0), end
    assert sorted(end["node_ids"]) == nodes
    done = {p.stem: float(p.read_text()) for p in out.glob("*.done")}
    assert sorted(done) == nodes  # both processes ran to their end
    assert end["time"] >= max(done.values())  # decided by the later one, not the first
    time.sleep(3.0)  # no second end (the first host's exit 0 is not the job's)
    assert [e["kind"] for e in _ends(local, "both")] == ["finished"]

    # ---- one host's process fails: `failed` at once, naming it; the other is stopped
    out = tmp_path / "fails"
    local.publish(_job("fails", out, {"first": 3, "other": 0}, {"first": 1.0, "other": 120.0}))
    t0 = time.monotonic()
    first = local.wait("ended", "fails", timeout=180)
    starts = [e for e in local.events("fails") if e["kind"] == "started"]
    (bad,) = [p.stem for p in out.glob("*.done")]  # the one that exited 3
    assert (first["kind"], first.get("exit_code"), first["node_ids"]) == ("failed", 3, [bad])
    assert f"exit code 3 on {bad}" in first["detail"] and "boom on" in first["detail"]
    (other,) = {n for e in starts for n in e["node_ids"]} - {bad}
    pid = int((out / f"{other}.pid").read_text())
    deadline = time.monotonic() + 60
    while _alive(pid):  # stopped well before its 120 s sleep ends
        assert time.monotonic() < deadline, "the other host's process was not stopped"
        time.sleep(0.2)
    assert time.monotonic() - t0 < 90
    assert not (out / f"{other}.done").exists()
    deadline = time.monotonic() + 30
    while len(_ends(local, "fails")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    kinds = [(e["kind"], e["node_ids"]) for e in _ends(local, "fails")]
    assert kinds == [("failed", [bad]), ("failed", [other])], kinds  # never `finished`
    assert f"stopped: its process on {bad} failed" in _ends(local, "fails")[1]["detail"]

    # ---- a kill stops the processes on both hosts
    out = tmp_path / "killed"
    local.publish(_job("killed", out, {"first": 0, "other": 0}, {"first": 120.0, "other": 120.0}))
    deadline = time.monotonic() + 180
    while len(list(out.glob("*.pid"))) < 2:  # both processes are running
        assert time.monotonic() < deadline, local.events("killed")
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in out.glob("*.pid")]
    kill = json.dumps({"job_id": "killed", "reason": "test"}).encode()
    local.producer.send("rltune.jobs.kill", kill).get(30)
    end = local.wait("ended", "killed", timeout=60)
    assert end["kind"] == "failed" and "killed on request (test)" in end["detail"], end
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, "a killed job's process still runs"
        time.sleep(0.2)
    assert not list(out.glob("*.done"))
    assert "finished" not in [e["kind"] for e in local.events("killed")]
