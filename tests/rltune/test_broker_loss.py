"""The CLI when its broker goes away mid-command: `metrics --follow` keeps waiting
with one outage line (not aiokafka's flood of connection errors), and
`submit --wait` ends with one line per job that was sent but not confirmed, a
non-zero exit and no traceback. Each test runs a broker of its own and stops it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from shared.broker import EmbeddedBroker, ensure_topics
from shared.config import BusSettings
from shared.messages import MetricsSnapshot


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, BusSettings]]:
    b = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    try:
        settings = BusSettings(bootstrap=b.bootstrap, topic_prefix="loss.")
        asyncio.run(ensure_topics(settings))
        yield b, settings
    finally:
        b.stop()


def _cli(settings: BusSettings, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "RLTUNE_BOOTSTRAP_SERVERS": settings.bootstrap,
        "RLTUNE_TOPIC_PREFIX": settings.topic_prefix,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "rltune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


async def _publish_snapshot(settings: BusSettings, source: str) -> None:
    p = AIOKafkaProducer(bootstrap_servers=settings.bootstrap)
    await p.start()
    try:
        snap = MetricsSnapshot(source=source, counters={"seen": 1.0})
        await p.send_and_wait(settings.topics.metrics, msgspec.json.encode(snap))
    finally:
        await p.stop()


def test_metrics_follow_waits_through_a_lost_broker_with_one_line(
    own_broker: tuple[EmbeddedBroker, BusSettings],
) -> None:
    broker, settings = own_broker
    asyncio.run(_publish_snapshot(settings, "before"))
    proc = _cli(settings, "metrics", "--follow")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # following: the snapshot already there, piped: JSON
        assert json.loads(line)["source"] == "before", line
        broker.stop()
        time.sleep(6)  # aiokafka retries many times a second meanwhile
        assert proc.poll() is None, "metrics --follow exited when the broker went away"
        proc.send_signal(signal.SIGINT)
        _out, err = _finish(proc, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, err  # stopped by the Ctrl-C, not by the outage
    lines = err.strip().splitlines()  # all that came of ~6 s of failing reconnects
    assert len(lines) == 1 and lines[0].startswith("Kafka broker unreachable ("), err


def _sent(settings: BusSettings, timeout_s: float) -> bool:
    async def poll() -> bool:
        c = AIOKafkaConsumer(
            settings.topics.jobs_submit,
            bootstrap_servers=settings.bootstrap,
            auto_offset_reset="earliest",
        )
        await c.start()
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if any((await c.getmany(timeout_ms=200)).values()):
                    return True
            return False
        finally:
            await c.stop()

    return asyncio.run(poll())


def test_submit_wait_when_the_broker_dies_mid_wait(
    own_broker: tuple[EmbeddedBroker, BusSettings],
) -> None:
    """No arrival service: the job is sent, then the broker dies while the command
    waits for its answer."""
    broker, settings = own_broker
    proc = _cli(settings, "submit", "--job-id", "lost1", "--num-gpus", "1", "--wait",
                "--timeout", "8")  # fmt: skip
    try:
        assert _sent(settings, 30), "the job never reached the submit topic"
        broker.stop()
        out, err = _finish(proc, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, (out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert f"submitted 1 job(s) to {settings.topics.jobs_submit}" in out, out
    assert [ln for ln in out.splitlines() if ln.startswith("lost1:")] == [
        "lost1: no answer (is the arrival service running?)"
    ], out
    assert len(err.strip().splitlines()) <= 1, err
