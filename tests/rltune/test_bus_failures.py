"""The bus commands when things go wrong: nothing listening, bad ports, the broker
killed under `rltune broker`, and a second
`submit --wait` of the same jobs."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rltune import main
from shared.broker import EmbeddedBroker, free_port
from shared.config import BusSettings
from tests.rltune.test_bus_commands import rltune

NOTHING = "127.0.0.1:1"  # nothing listens on port 1


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["submit", "--job-id", "x", "--num-gpus", "1", "--bootstrap", NOTHING], "cannot reach"),
        (["submit", "--job-id", "x", "--num-gpus", "1", "--bootstrap", "nosuch.invalid:9092"],
         "cannot reach"),
        (["metrics", "--bootstrap", NOTHING], "cannot reach"),
        (["service", "arrival", "--bootstrap", NOTHING, "--connect-timeout", "1"],
         "no Kafka broker answered"),
        (["broker", "--port", "-5"], "not a TCP port"),
        (["broker", "--port", "70000"], "not a TCP port"),
        (["broker", "--partitions", "0"], "not a positive"),
        (["up", "--port", "-1"], "not a TCP port"),
        (["up", "--limit", "-4"], "not a positive"),
        (["service", "arrival", "--prometheus-port", "-1"], "not a TCP port"),
        (["service", "arrival", "--prometheus-port", "70000"], "not a TCP port"),
        (["submit", "--job-id", "x", "--num-gpus", "1", "--wait", "--timeout", "-3"],
         "not a positive"),
    ],
)  # fmt: skip
def test_bus_mistakes_are_one_line_and_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process (what `rltune` runs, without a process start per case)."""
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_metrics_port_in_use_is_one_line(
    busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["service", "arrival", "--prometheus-port", str(busy_port), "--bootstrap", NOTHING]
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"cannot serve metrics on 127.0.0.1:{busy_port}" in lines[0]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


@pytest.mark.integration  # starts a broker in a subprocess
def test_broker_command_fails_when_its_broker_dies() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rltune", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "broker ready" in proc.stdout.readline()
        (child,) = _children(proc.pid)
        os.kill(child, signal.SIGKILL)
        assert proc.wait(30) == 1
        assert "broker process exited" in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def test_submit_wait_reports_this_submissions_answers(
    bus: BusSettings, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """The same five jobs three times: the first run accepted, then duplicates of live
    jobs, each run told about its own messages (not the first run's answers)."""
    from services.arrival import service as arrival

    env = {"RLTUNE_BOOTSTRAP_SERVERS": broker.bootstrap, "RLTUNE_TOPIC_PREFIX": bus.topic_prefix}
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(f'{{"job_id": "w{i}", "num_gpus": 1}}\n' for i in range(5)))
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        runs = []
        for _ in range(3):
            r = await asyncio.to_thread(rltune, "submit", "--file", str(jobs), "--wait", env=env)
            runs.append(r)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout.count(": accepted") == 5
    for r in runs[1:]:
        assert r.returncode == 1
        assert r.stdout.count("duplicates a live job") == 5, r.stdout
        assert ": accepted" not in r.stdout


def test_a_service_probes_the_broker_logged_in_as_itself(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rltune service` waits for the broker with the login it will use (SASL/SCRAM from
    RLTUNE_KAFKA_SASL_*). The embedded broker speaks no SASL, so a service set to log in
    is told at once, in one line, that no broker answered it; an anonymous probe would
    have passed and left the service retrying behind a ready broker."""
    monkeypatch.setenv("RLTUNE_KAFKA_SASL_USERNAME", "rltune-arrival")
    monkeypatch.setenv("RLTUNE_KAFKA_SASL_PASSWORD", "not-checked-here")
    args = ["service", "arrival", "--bootstrap", broker.bootstrap, "--connect-timeout", "2"]
    assert main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"no Kafka broker answered at {broker.bootstrap}" in line
