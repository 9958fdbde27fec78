"""What a service exposes over HTTP, on the real broker: /metrics that Prometheus's own
checker accepts (promtool, else the Prometheus text parser), /healthz and /readyz that
follow the consume loop, and a planner that cannot stall the loop."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from offload_agent import agent
from offload_agent.metrics import forget, observe
from services.arrival import service as arrival
from services.profiler import service as profiler
from shared.broker import free_port
from shared.bus import Record, read_back
from shared.config import BusSettings
from shared.health import HEALTH
from shared.messages import OffloadStats, Rejection, TensorProfile, encode
from shared.prom import serve_http, track
from tests.integration.arrival_load import produce


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def check_exposition(text: str) -> None:
    """`promtool check metrics` when Debian's prometheus package is installed; else
    the same rules through prometheus_client's parser: it parses, counters end in
    `_total`, every family has help text, "quantile" only on summaries, no sample twice."""
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for family in text_string_to_metric_families(text):
        assert family.documentation, family.name
        for s in family.samples:
            if family.type == "counter" and not s.name.endswith(("_created",)):
                assert s.name.endswith("_total"), s.name
            if family.type not in ("summary",):
                assert "quantile" not in s.labels, s.name
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in seen, key
            seen.add(key)


async def test_every_services_metrics_pass_promtool(bus: BusSettings, tmp_path: Path) -> None:
    port = free_port()
    serve_http(port)
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in range(3)]
    config = agent.AgentConfig(tmp_path / "agent.sock", "node-a", status_interval_s=60)
    tasks = [
        asyncio.create_task(arrival.serve(bus, stop, readies[0])),
        asyncio.create_task(profiler.serve(bus, stop, readies[1])),
        asyncio.create_task(agent.serve(bus, stop, readies[2], config=config)),
    ]
    try:
        for name in ("arrival", "profiler"):
            track(name)
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 90)
        await produce(bus, [b'{"job_id": "m1", "num_gpus": 1}', b"junk"])
        for job, n in (("j1", 100), ("j1", 250), ("j2", 40)):
            observe(OffloadStats(job, "node-a", 0.9, bytes_in=n, bytes_out=n // 2))
        await asyncio.sleep(1.0)
        status, text = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        check_exposition(text)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        moved = families["rltune_offload_moved_bytes"]
        assert moved.type == "counter"
        (inbound,) = [
            s for s in moved.samples
            if s.name.endswith("_total") and s.labels == {"node": "node-a", "direction": "in"}
        ]  # fmt: skip
        assert inbound.value >= 250 + 40  # j1's running total, then j2's
        forget("j1", "node-a")
        _, after = _get(f"http://127.0.0.1:{port}/metrics")
        assert 'job="j1"' not in after and 'job="j2"' in after
        assert "rltune_service_ready" in after and "rltune_service_up" in after
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def test_readiness_follows_the_consume_loop(bus: BusSettings) -> None:
    """/readyz turns 503 while the event loop is blocked (the HTTP thread still
    answers: /metrics alone cannot tell), and 200 again once it turns."""
    port = free_port()
    serve_http(port)
    base = f"http://127.0.0.1:{port}"
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(arrival.serve(bus, stop, ready))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        health = HEALTH["arrival"]
        health.ready_after_s = 1.0

        async def answers(path: str, code: int) -> None:
            deadline = time.monotonic() + 30
            while _get(f"{base}{path}")[0] != code and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert _get(f"{base}{path}")[0] == code, path

        await answers("/readyz", 200)
        time.sleep(1.5)  # blocks the event loop, as a runaway handler would
        status, why = _get(f"{base}/readyz")
        assert status == 503 and "has not turned" in why
        assert _get(f"{base}/healthz")[0] == 200  # not stuck for long yet
        health.live_after_s = 1.0  # (still blocked) as if it had been stuck for minutes
        status, why = _get(f"{base}/healthz")
        assert status == 503 and "stuck" in why  # liveness fails: restart it
        health.live_after_s = 120.0
        await answers("/readyz", 200)  # turning again
        await answers("/healthz", 200)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def _big_profile(n: int) -> TensorProfile:
    tensors = [(f"t{i}", 4096 * (i + 1), "float32", "param") for i in range(n)]
    total = sum(t[1] for t in tensors)
    return TensorProfile(
        job_id="big",
        tensors=tensors,
        order=[t[0] for t in tensors] * 2,
        fast_budget_bytes=total // 3,
        host_budget_bytes=total // 3,
    )


async def test_a_huge_profile_is_refused_at_the_budget_and_the_loop_keeps_turning(
    bus: BusSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile of 6,000 size classes takes the planner tens of seconds. Over the
    budget it is refused; meanwhile the event loop serves (a ticker keeps ticking)
    and the next profile is planned."""
    monkeypatch.setitem(os.environ, "RLTUNE_PLAN_BUDGET_S", "1")
    good = TensorProfile(
        job_id="small",
        tensors=[("w", 1 << 20, "float32", "param")],
        order=["w"],
        fast_budget_bytes=8 << 20,
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(profiler.serve(bus, stop, ready))
    gaps: list[float] = []

    async def ticker() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.05)
            gaps.append(time.monotonic() - t0)

    tick = asyncio.create_task(ticker())
    try:
        await asyncio.wait_for(ready.wait(), 60)
        await produce(bus, [encode(_big_profile(6000)), encode(good)], bus.topics.offload_profiles)
        dlq = bus.topics.dead_letter(bus.topics.offload_profiles)
        got: list[Record] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = []
            await read_back(bus, [bus.topics.offload_plans, dlq], got.append)
            if len(got) >= 2:
                break
            await asyncio.sleep(0.3)
        # the planner alone takes over ten times its budget: run on the loop, it would
        # have held it that long; in its worker, the loop's longest wait is far shorter
        assert max(gaps) < 8.0, max(gaps)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, tick), 30)
    by_topic = {r.topic: r for r in got}
    assert set(by_topic) == {bus.topics.offload_plans, dlq}
    rej = msgspec.json.decode(by_topic[dlq].value or b"", type=Rejection)
    assert rej.job_id == "big" and "budget of 1 s" in rej.reason
    assert by_topic[bus.topics.offload_plans].key == b"small"
