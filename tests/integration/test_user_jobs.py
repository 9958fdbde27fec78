"""Users' jobs, end to end: `rltune up` itself (its embedded broker, every service and
two host agents of four emulated GPUs, as a user starts it) runs jobs that a stock
Kafka client (kafka-python, not the project's code) publishes, and the command line
follows, lists and kills them; during a replay (`rltune up --trace`) a user's job is
refused at once with its reason, never left waiting."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from shared.broker import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(420),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # kafka-python's importlib use
]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "philly-2000.jsonl"
ENDS = ("finished", "failed", "cancelled")


def rltune(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rltune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


class Up:
    """`rltune up ARGS` in a child process, with a stock Kafka client on its broker."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.logs = tmp / "logs"
        cmd = [sys.executable, "-m", "rltune", "up", "--port", str(self.port)]
        cmd += ["--logs", str(self.logs), *args]
        self.out = open(tmp / "up.out", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, cwd=ROOT)
        self.seen: dict[str, list[dict[str, Any]]] = {"events": [], "rejected": [], "accepted": []}
        deadline = time.monotonic() + 120
        while True:  # the broker is up once a client connects
            assert self.proc.poll() is None, (tmp / "up.out").read_text()
            try:
                self.producer = KafkaProducer(bootstrap_servers=self.bootstrap)
                break
            except KafkaError:  # (no broker yet)
                assert time.monotonic() < deadline, "rltune up's broker never came up"
                time.sleep(0.5)
        self.consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap, consumer_timeout_ms=200, auto_offset_reset="earliest"
        )
        self.consumer.assign([TopicPartition(f"rltune.jobs.{t}", 0) for t in self.seen])

    def publish(self, spec: dict[str, Any] | bytes) -> None:
        raw = spec if isinstance(spec, bytes) else json.dumps(spec).encode()
        self.producer.send("rltune.jobs.submit", raw).get(30)

    def poll(self) -> None:
        for m in self.consumer:
            self.seen[m.topic.rsplit(".", 1)[1]].append(json.loads(m.value))

    def events(self, job_id: str) -> list[dict[str, Any]]:
        self.poll()
        return [e for e in self.seen["events"] if e["job_id"] == job_id]

    def wait(self, what: str, job_id: str, timeout: float = 120) -> dict[str, Any]:
        """The first `what` (an event kind, `ended`, or `rejected` / `accepted`) of a job."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "rltune up stopped"
            self.poll()
            if what in ("rejected", "accepted"):
                hits = [r for r in self.seen[what] if r["job_id"] == job_id]
            else:
                kinds = ENDS if what == "ended" else (what,)
                hits = [e for e in self.seen["events"] if e["job_id"] == job_id]
                hits = [e for e in hits if e["kind"] in kinds]
            if hits:
                return hits[0]
            time.sleep(0.2)
        raise AssertionError(f"no {what} for {job_id} in {timeout} s: {self.events(job_id)}")

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return rltune(*args, "--bootstrap", self.bootstrap, timeout=timeout)

    def stop(self) -> str:
        self.producer.close()
        self.consumer.close()
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # Ctrl-C
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()
        return Path(self.out.name).read_text()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Up]:
    up = Up(tmp_path)  # no --trace: two hosts of four emulated GPUs
    try:
        yield up
    finally:
        up.stop()


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_published_jobs_run_fail_and_are_killed_on_the_local_cluster(
    local: Up, tmp_path: Path
) -> None:
    out = tmp_path / "written.txt"
    # a job that writes a file (its GPUs, as the agent gave them)
    writes = _py(f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])")
    local.publish({"job_id": "writes", "num_gpus": 2, "command": writes})
    started = local.wait("started", "writes")
    end = local.wait("ended", "writes")
    assert end["kind"] == "finished" and end["exit_code"] == 0, end
    kinds = [e["kind"] for e in local.events("writes")]
    assert kinds == ["started", "finished"]
    gpus = started["detail"].split("gpus ")[1]
    assert out.read_text() == gpus and len(gpus.split(",")) == 2
    assert started["node_ids"] == end["node_ids"] and started["node_ids"][0] in ("host-0", "host-1")

    # a failing command: its exit code, and the last lines it wrote on stderr
    fails = _py("import sys; print('first', file=sys.stderr); sys.exit('it broke')")
    local.publish({"job_id": "fails", "num_gpus": 1, "command": fails})
    end = local.wait("ended", "fails")
    assert (end["kind"], end["exit_code"]) == ("failed", 1), end
    assert end["detail"] == "exit code 1; stderr:\nfirst\nit broke"

    # commands that cannot start: failed with the reason; the agents run on
    local.publish({"job_id": "missing", "num_gpus": 1, "command": ["/nonexistent/train"]})
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    local.publish({"job_id": "noexec", "num_gpus": 1, "command": [str(script)]})
    end = local.wait("ended", "missing")
    assert end["kind"] == "failed" and "exit_code" not in end
    assert end["detail"] == "cannot start '/nonexistent/train': No such file or directory"
    end = local.wait("ended", "noexec")
    assert end["detail"] == f"cannot start {str(script)!r}: Permission denied", end
    # every GPU of both hosts at once: both agents still take work
    local.publish({"job_id": "after", "num_gpus": 8, "command": _py("0")})
    assert local.wait("ended", "after")["kind"] == "finished"
    assert sorted(
        n for e in local.events("after") if e["kind"] == "started" for n in e["node_ids"]
    ) == [
        "host-0",
        "host-1",
    ]

    # a gang: a job on both hosts runs its command on each; when one fails, the other
    # is stopped (not left holding its GPUs)
    # (host-1's fails once host-0's has written its file: host-0's is then running)
    gang = _py(
        "import os, sys, time; node = os.environ['RLTUNE_NODE_ID']; "
        f"d = {str(tmp_path)!r}; "
        "open(d + '/gang-' + node, 'w').write(os.environ['RLTUNE_JOB_NODES']); "
        "[time.sleep(0.1) for _ in range(600) if not os.path.exists(d + '/gang-host-0')]; "
        "sys.exit(3) if node == 'host-1' else time.sleep(300)"
    )
    local.publish({"job_id": "gang", "num_gpus": 8, "command": gang})
    deadline = time.monotonic() + 120
    while len([e for e in local.events("gang") if e["kind"] == "failed"]) < 2:
        assert time.monotonic() < deadline, local.events("gang")
        time.sleep(0.2)
    ends = {e["node_ids"][0]: e for e in local.events("gang") if e["kind"] == "failed"}
    assert ends["host-1"]["exit_code"] == 3
    assert (
        ends["host-0"]["detail"] == "stopped: its process on host-1 failed; exit code -15 on host-0"
    )
    for node in ("host-0", "host-1"):
        assert (tmp_path / f"gang-{node}").read_text() == "host-0,host-1"

    # a malformed JobSpec is answered on jobs.rejected with the field named
    local.publish(b'{"job_id": "bad", "num_gpus": "two"}')
    assert "$.num_gpus" in local.wait("rejected", "bad")["reason"]

    # kills: a job holding every GPU runs; one behind it waits and is cancelled
    local.publish({"job_id": "hog", "num_gpus": 8, "command": _py("import time; time.sleep(300)")})
    local.wait("started", "hog")
    local.publish({"job_id": "queued", "num_gpus": 1, "command": _py("0")})
    local.wait("accepted", "queued")
    r = local.cli("submit", "--kill", "queued", "--reason", "not needed", "--wait")
    assert r.returncode == 0, r.stderr
    assert "queued: cancelled (killed while queued (not needed))" in r.stdout
    assert [e["kind"] for e in local.events("queued")] == ["cancelled"]
    listed = json.loads(local.cli("jobs", "--json", "-").stdout)
    assert [(j["job_id"], j["state"]) for j in listed] == [("hog", "RUNNING")]
    assert sorted(listed[0]["nodes"]) == ["host-0", "host-1"]
    r = local.cli("submit", "--kill", "hog", "--wait")
    assert r.returncode == 0 and "hog: failed" in r.stdout and "killed on request" in r.stdout
    end = local.wait("ended", "hog")
    assert end["kind"] == "failed" and end["detail"].startswith("killed on request; exit code")

    # submit --wait finished: every event, then the job's own status
    r = local.cli(
        "submit", "--job-id", "ok", "--num-gpus", "1", "--command", "true", "--wait", "finished"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln.split(" ", 1)[1] for ln in r.stdout.splitlines()]
    assert lines[:2] == ["ok: submitted to rltune.jobs.submit", "ok: accepted"]
    assert lines[2].startswith("ok: started on host-") and lines[3].startswith("ok: finished on")
    r = local.cli(
        "submit", "--job-id", "four", "--num-gpus", "1", "--command", "sh -c 'exit 4'",
        "--wait", "finished",
    )  # fmt: skip
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].endswith("four: failed on host-0 (exit code 4)") or (
        r.stdout.splitlines()[-1].endswith("four: failed on host-1 (exit code 4)")
    )

    # commands that exit at once: on the topic, each job's started comes before its end
    for i in range(6):
        local.publish({"job_id": f"quick-{i}", "num_gpus": 1, "command": ["true"]})
    for i in range(6):
        local.wait("ended", f"quick-{i}")
        assert [e["kind"] for e in local.events(f"quick-{i}")] == ["started", "finished"]

    # a requested wall time (JobSpec.time_limit_s, Slurm's --time): stopped when reached
    sleeper = _py("import time; time.sleep(120)")
    local.publish({"job_id": "limited", "num_gpus": 1, "time_limit_s": 1, "command": sleeper})
    end = local.wait("ended", "limited")
    assert end["detail"] == "stopped: time limit of 1 s reached; exit code -15", end

    # rltune jobs, read from the topics: each job's last state
    listed = json.loads(local.cli("jobs", "--all", "--json", "-").stdout)
    states = {j["job_id"]: j["state"] for j in listed}
    assert states == {
        "writes": "FINISHED", "fails": "FAILED", "missing": "FAILED", "noexec": "FAILED",
        "after": "FINISHED", "gang": "FAILED", "bad": "REJECTED", "hog": "FAILED",
        "queued": "CANCELLED", "ok": "FINISHED", "four": "FAILED",
        **{f"quick-{i}": "FINISHED" for i in range(6)},
        "limited": "FAILED",
    }  # fmt: skip
    assert {j["job_id"]: j["exit_code"] for j in listed}["four"] == 4
    # the example script of the README: published and followed to its end
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "submit_and_follow.py"), local.bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].split()[0] == "finished"
    view = local.stop()  # Ctrl-C: every service stops cleanly, none had stopped before
    assert local.proc.returncode == 0, view
    assert "a local cluster of 2 host(s) x 4 emulated GPUs of type GPU" in " ".join(view.split())


def test_a_users_job_during_a_replay_is_refused_at_once_with_the_reason(tmp_path: Path) -> None:
    up = Up(tmp_path, "--trace", str(SAMPLE), "--limit", "20", "--speedup", "100")
    try:
        up.publish({"job_id": "mine", "num_gpus": 1, "command": ["true"]})
        reason = up.wait("rejected", "mine")["reason"]
        assert reason.startswith("job mine is not run: this deployment replays a trace")
        assert "rltune up` without --trace" in reason
        # the replay's own jobs are accepted and run on the simulated cluster
        first = json.loads(SAMPLE.read_text().splitlines()[0])["job_id"]
        up.wait("accepted", first)
        up.wait("started", first)
        up.poll()
        assert all(r["job_id"] != "mine" for r in up.seen["accepted"])
        # and `why` says so
        r = up.cli("why", "mine")
        assert r.returncode == 0 and "mine was rejected on arrival: job mine is not run" in r.stdout
    finally:
        up.stop()
