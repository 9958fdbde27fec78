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
    committed_offset,
    expected_outcome,
    mixed_load,
    produce,
    service_counters,
    settled_answers,
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


# The arrival service with one change: at the first commit that would move its group past
# input offset argv[1] of topic argv[2], it stops itself (SIGSTOP), so that the test can
# SIGKILL it there: that batch's answers are published and acknowledged, its inputs are not
# committed yet. It is the worst moment for a crash, and no wall clock picks it.
# Its consumer's session is short (6 s, not 10 s) only so that the broker drops the dead
# member soon and the restart joins the group without waiting out a second rebalance.
_STOP_BEFORE_COMMIT = """
import os, runpy, signal, sys
from aiokafka import AIOKafkaConsumer
after, topic = int(sys.argv[1]), sys.argv[2]
commit, init = AIOKafkaConsumer.commit, AIOKafkaConsumer.__init__
async def stopping_commit(self, offsets=None):
    offsets = offsets or {}
    if any(getattr(o, "offset", o) > after for tp, o in offsets.items() if tp.topic == topic):
        os.kill(os.getpid(), signal.SIGSTOP)
    return await commit(self, offsets)
def short_session_init(self, *topics, **kw):
    init(self, *topics, **kw, session_timeout_ms=6000, heartbeat_interval_ms=1000)
AIOKafkaConsumer.commit = stopping_commit
AIOKafkaConsumer.__init__ = short_session_init
sys.argv = ["rltune", *sys.argv[3:]]
runpy.run_module("rltune", run_name="__main__", alter_sys=True)
"""


def _start_service(
    bus: BusSettings, group_id: str | None = None, stop_past: int | None = None
) -> subprocess.Popen[bytes]:
    """`rltune service arrival`; with `stop_past`, stopped before the commit that passes
    that offset of jobs.submit (see _STOP_BEFORE_COMMIT)."""
    env = dict(
        os.environ, RLTUNE_BOOTSTRAP_SERVERS=bus.bootstrap, RLTUNE_TOPIC_PREFIX=bus.topic_prefix
    )
    extra = ["--group-id", group_id] if group_id else []
    if stop_past is None:
        head = ["-m", "rltune"]
    else:
        head = ["-c", _STOP_BEFORE_COMMIT, str(stop_past), bus.topics.jobs_submit]
    return subprocess.Popen(
        [sys.executable, *head, "service", "arrival", *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    return proc.stderr.read().decode()[-2000:] if proc.stderr else ""


async def _wait_for_commit(
    bus: BusSettings, proc: subprocess.Popen[bytes], group: str, offset: int, timeout_s: float
) -> None:
    """Until `group` has committed `offset` on jobs.submit (the service still running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the service ended (code {proc.returncode}):\n{_stderr(proc)}")
        if await committed_offset(bus, group, bus.topics.jobs_submit) >= offset:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{group} did not commit offset {offset} in {timeout_s} s")


async def _wait_until_stopped(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until `proc` is stopped by a signal (it is left stopped and unreaped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flags = os.WSTOPPED | os.WEXITED | os.WNOHANG | os.WNOWAIT
        info = os.waitid(os.P_PID, proc.pid, flags)
        if info is not None and info.si_code == os.CLD_STOPPED:
            return
        if info is not None:
            proc.wait()
            raise AssertionError(f"the service ended (code {proc.returncode}):\n{_stderr(proc)}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"the service did not reach its stop point in {timeout_s} s")


def _end(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and it must exit cleanly."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 0, _stderr(proc)


async def _wait_for_counters(bus: BusSettings, consumed: int, timeout_s: float) -> dict[str, float]:
    """The service's latest counters once they show `consumed` inputs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snaps = await service_counters(bus, "arrival")
        if snaps and snaps[-1].get("consumed", 0) >= consumed:
            return snaps[-1]
        await asyncio.sleep(0.5)
    raise AssertionError(f"the service did not report {consumed} inputs consumed")


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


async def test_sigkill_mid_stream_loses_nothing_and_duplicates_nothing(bus: BusSettings) -> None:
    msgs = mixed_load(N_VALID, N_BAD, seed=2)
    want_acc, want_rej = expected_outcome(msgs)
    quarter, half = len(msgs) // 4, len(msgs) // 2
    group = bus.topic_prefix + "arrival"
    # The first run sees only the first half of the stream, a quarter at a time: it answers
    # and commits the first quarter, then stops itself after publishing the answers to a
    # batch of the second quarter, before committing them; there it is killed.
    await produce(bus, msgs[:quarter])
    proc = _start_service(bus, stop_past=quarter)
    try:
        await _wait_for_commit(bus, proc, group, quarter, timeout_s=120)
        await produce(bus, msgs[quarter:half])
        await _wait_until_stopped(proc, timeout_s=120)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL

        # At the kill: answers out for the first inputs, far from all of them, the group's
        # commit behind them (those inputs come again after the restart, already answered).
        at_kill = await settled_answers(bus)
        answered = at_kill.total
        committed = await committed_offset(bus, group, bus.topics.jobs_submit)
        print(f"at the kill: {answered}/{len(msgs)} answered, {committed} committed")
        assert committed == quarter < answered <= half < len(msgs)
        assert at_kill.inputs == dict.fromkeys(range(answered), 1)

        await produce(bus, msgs[half:])
        proc = _start_service(bus)
        got = await collect_answers(bus, len(msgs), timeout_s=120)
        assert got.accepted == want_acc  # every valid id, once
        assert got.rejected == want_rej  # every bad message, once
        assert got.inputs == dict.fromkeys(range(len(msgs)), 1)  # every input answered once
        counters = await _wait_for_counters(bus, len(msgs) - committed, timeout_s=60)
        assert counters["consumed"] == len(msgs) - committed
        assert counters["skipped_redelivered"] == answered - committed
        assert counters["published"] == len(msgs) - answered
        _end(proc)

        # Lose every committed offset (a new consumer group re-reads everything):
        # the service must recognise all 10,000 as answered and publish nothing more.
        proc = _start_service(bus, group_id=bus.topic_prefix + "arrival-fresh")
        await _wait_for_skips(bus, len(msgs), timeout_s=60)
        again = await collect_answers(bus, len(msgs), timeout_s=30)
        assert again.accepted == want_acc
        assert again.rejected == want_rej
        _end(proc)
    finally:
        if proc.poll() is None:  # a failure above: no more checks, just no leftover
            proc.kill()
            proc.wait(10)


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


async def test_a_restarted_arrival_knows_every_node_not_only_those_reporting_since(
    bus: BusSettings,
) -> None:
    """Two nodes of four GPUs reported before a restart, one again after it: an 8-GPU job
    fits the cluster and is accepted (the inventory used to start empty and learn only
    the nodes reporting after the restart, so the job was refused as too large)."""
    from shared.bus import Producer, Record, read_back
    from shared.messages import JobSpec, NodeStatus, encode

    t = bus.topics

    async def publish(*msgs: tuple[str, str, bytes]) -> None:
        async with Producer(bus) as p:
            for topic, key, value in msgs:
                await (await p.send(topic, key, value))

    async def run_until(n_answers: int, *msgs: tuple[str, str, bytes]) -> list[Record]:
        """Arrival until `n_answers` are out; `msgs` are published once it has started,
        the second a moment after the first (so it has seen the first by then)."""
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(arrival.serve(bus, stop, ready))
        try:
            await asyncio.wait_for(ready.wait(), 60)
            for i, msg in enumerate(msgs):
                await publish(msg)
                if i == 0 and len(msgs) > 1:
                    await asyncio.sleep(3.0)
            for _ in range(150):
                got: list[Record] = []
                await read_back(bus, [t.jobs_accepted, t.jobs_rejected], got.append)
                if len(got) >= n_answers:
                    return got
                await asyncio.sleep(0.2)
            return got
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)

    node = [NodeStatus(f"n{i}", "V100", 4, [0, 1, 2, 3]) for i in range(2)]
    await publish(*[(t.cluster_nodes, n.node_id, encode(n)) for n in node])
    small = JobSpec(job_id="small", num_gpus=2)
    await run_until(1, (t.jobs_submit, "small", encode(small)))  # it has seen both nodes
    big = JobSpec(job_id="big", num_gpus=8)
    answers = await run_until(
        2,
        (t.cluster_nodes, "n0", encode(node[0])),  # only n0 reports after the restart
        (t.jobs_submit, "big", encode(big)),
    )
    assert sorted((r.topic, r.key) for r in answers) == [
        (t.jobs_accepted, b"big"),
        (t.jobs_accepted, b"small"),
    ]
