"""The arrival service on the real broker: every valid job accepted exactly once, every bad
message rejected exactly once with a reason, through garbage and through SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from services.arrival import service as arrival
from shared.config import BusSettings
from tests.integration.arrival_load import (
    collect_answers,
    expected_outcome,
    mixed_load,
    produce,
    service_counters,
)

N_VALID = 5000
N_BAD = 5000


async def test_mixed_load_each_message_answered_exactly_once(bus: BusSettings) -> None:
    msgs = mixed_load(N_VALID, N_BAD, seed=1)
    want_acc, want_rej = expected_outcome(msgs)
    assert sum(want_acc.values()) == N_VALID and sum(want_rej.values()) == N_BAD

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    await asyncio.wait_for(ready.wait(), 30)
    await produce(bus, msgs)
    got = await collect_answers(bus, len(msgs), timeout_s=120)

    assert got.accepted == want_acc  # every valid id, once
    assert got.rejected == want_rej  # every bad message (by its raw bytes), once
    assert all(r.strip() for r in got.reasons)
    assert any("duplicates a live job" in r for r in got.reasons)
    assert any("$.num_gpus" in r for r in got.reasons)

    # still running and answering
    assert not task.done()
    await produce(bus, [b'{"job_id": "after-garbage", "num_gpus": 1}'])
    after = await collect_answers(bus, len(msgs) + 1, timeout_s=30)
    assert after.accepted["after-garbage"] == 1
    stop.set()
    stats = await asyncio.wait_for(task, 30)
    assert stats.consumed == len(msgs) + 1
    assert sum(stats.rejected.values()) == N_BAD


def _start_service(bus: BusSettings, group_id: str | None = None) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, RLTUNE_BOOTSTRAP_SERVERS=bus.bootstrap, RLTUNE_TOPIC_PREFIX=bus.topic_prefix
    )
    extra = ["--group-id", group_id] if group_id else []
    return subprocess.Popen(
        [sys.executable, "-m", "shared.cli", "service", "arrival", *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def _wait_for_answers(bus: BusSettings, at_least: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await collect_answers(bus, at_least, timeout_s=0.5)
        if got.total >= at_least:
            return got.total
    raise AssertionError(f"fewer than {at_least} answers after {timeout_s} s")


async def _wait_for_skips(bus: BusSettings, n: int, timeout_s: float) -> None:
    """Until the service reports `n` inputs skipped as already answered."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snaps = await service_counters(bus, "arrival")
        if snaps and snaps[-1].get("skipped_redelivered", 0) >= n:
            assert snaps[-1]["published"] == 0  # metrics aside, nothing new went out
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the restarted service did not skip {n} answered inputs")


async def test_sigkill_half_way_loses_nothing_and_duplicates_nothing(bus: BusSettings) -> None:
    msgs = mixed_load(N_VALID, N_BAD, seed=2)
    want_acc, want_rej = expected_outcome(msgs)
    proc = _start_service(bus)
    try:
        await produce(bus, msgs)
        answered = await _wait_for_answers(bus, len(msgs) // 2, timeout_s=120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert answered >= len(msgs) // 2
        proc = _start_service(bus)
        got = await collect_answers(bus, len(msgs), timeout_s=120)
        assert got.accepted == want_acc
        assert got.rejected == want_rej

        # Lose every committed offset (a new consumer group re-reads everything):
        # the service must recognise all 10,000 as answered and publish nothing more.
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc = _start_service(bus, group_id=bus.topic_prefix + "arrival-fresh")
        await _wait_for_skips(bus, len(msgs), timeout_s=60)
        again = await collect_answers(bus, len(msgs), timeout_s=5)
        assert again.accepted == want_acc
        assert again.rejected == want_rej
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""


async def test_oversized_message_is_rejected_with_its_head_and_nothing_is_lost(
    bus: BusSettings,
) -> None:
    big = b'{"job_id": "big", "num_gpus": 1, "pad": "' + b"x" * (2 << 20) + b'"}'
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    await asyncio.wait_for(ready.wait(), 30)
    await produce(bus, [big, b'{"job_id": "small", "num_gpus": 1}'])
    got = await collect_answers(bus, 2, timeout_s=60)
    stop.set()
    await asyncio.wait_for(task, 30)
    assert got.accepted == {"small": 1}
    ((raw, n),) = got.rejected.items()
    assert n == 1 and raw == big[: 1 << 16].decode()
    assert "exceeds 1 MiB" in got.reasons[0]
