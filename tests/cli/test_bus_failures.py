"""The bus commands when things go wrong: nothing listening, bad ports, the broker
killed under `rltune broker` or restarted under a running service, and a second
`submit --wait` of the same jobs."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.broker import EmbeddedBroker, ensure_topics, free_port
from shared.cli import main
from shared.config import BusSettings
from tests.cli.test_bus_commands import rltune
from tests.integration.arrival_load import collect_answers, produce

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


def test_metrics_port_in_use_is_one_line(busy_port: int) -> None:
    r = rltune("service", "arrival", "--prometheus-port", str(busy_port), "--bootstrap", NOTHING)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
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


def test_broker_command_fails_when_its_broker_dies() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shared.cli", "broker", "--port", str(port)],
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


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _wait_status(url: str, code: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _get(url) == code:
            return
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer {code} within {timeout_s} s (last {_get(url)})")


def test_a_service_outlives_a_broker_restart_with_one_line_per_outage(tmp_path: Path) -> None:
    """The broker stops and comes back (empty: the embedded one keeps nothing). The
    service logs one line when it is lost and one when it is back, no traceback, is
    not ready meanwhile, and answers jobs sent after the restart."""
    broker = EmbeddedBroker(free_port()).start()
    settings = BusSettings(broker.bootstrap, "restart.")
    port = free_port()
    err = tmp_path / "service.log"
    env = dict(
        os.environ,
        RLTUNE_BOOTSTRAP_SERVERS=settings.bootstrap,
        RLTUNE_TOPIC_PREFIX=settings.topic_prefix,
    )
    with err.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shared.cli", "service", "arrival",
             "--prometheus-port", str(port)],
            env=env, stdout=subprocess.DEVNULL, stderr=f,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(ensure_topics(settings))
        _wait_status(f"{base}/readyz", 200, 60)
        assert _get(f"{base}/healthz") == 200
        broker.stop()
        _wait_status(f"{base}/readyz", 503, 60)
        assert _get(f"{base}/healthz") == 200  # alive: waiting for the broker, not stuck
        time.sleep(3)
        broker.start()
        asyncio.run(ensure_topics(settings))
        asyncio.run(produce(settings, [b'{"job_id": "after-restart", "num_gpus": 1}']))
        got = asyncio.run(collect_answers(settings, 1, timeout_s=90))
        assert got.accepted == {"after-restart": 1}
        _wait_status(f"{base}/readyz", 200, 60)
        assert proc.poll() is None
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert re.search(r"^rltune_broker_outages_total 1\.0$", metrics, re.M), metrics[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        broker.stop()
    log = err.read_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log
    assert log.count("Kafka broker unreachable") == 1, log[-3000:]
    assert log.count("Kafka broker reachable again") == 1, log[-3000:]
