"""Periodic rounds (`SimConfig.round_interval_s`, `--round-interval`): events between
ticks only update the cluster and the queue; jobs start at the next multiple of the
interval. Checked by hand, against strict FIFO on a clock of ticks written here from
the definition, and as properties over random traces under every discipline."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from rltune import main
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cluster import ClusterSpec, parse_cluster
from shared.placement_api import DISCIPLINES
from shared.sim import SimConfig, SimResult, simulate
from shared.traces import TraceJob
from tests.paths import PHILLY

TWO_NODES = parse_cluster(
    {"nodes": [{"name": "n", "count": 2, "gpu_type": "P100", "gpus": 4}], "reference": "P100"}
)


def run(
    jobs: list[TraceJob],
    spec: ClusterSpec,
    interval: float,
    discipline: str = "strict",
    policy: str = "fifo",
) -> SimResult:
    config = SimConfig(discipline=discipline, round_interval_s=interval)
    placer = make_placer("greedy", reproducible=True)
    return simulate(jobs, spec, make_policy(policy), placer, config)


def starts(r: SimResult) -> dict[str, float]:
    return {rec.job_id: rec.segments[0].start_s for rec in r.records}


def strict_fifo_on_ticks(jobs: list[TraceJob], total: int, dt: float) -> dict[str, float]:
    """Strict FIFO on `total` interchangeable GPUs where jobs start only at multiples of
    `dt`: each at the first tick, not before its submission nor the previous job's
    start, with enough GPUs free (a job ending at a tick has freed them by then)."""
    running: list[tuple[float, int]] = []  # (finish, GPUs)
    out: dict[str, float] = {}
    t = 0.0
    for j in sorted(jobs, key=lambda j: j.submit_s):
        t = max(t, math.ceil(j.submit_s / dt) * dt)
        while total - sum(g for end, g in running if end > t) < j.num_gpus:
            t += dt
        out[j.job_id] = t
        running.append((t + (j.duration_s or 0.0), j.num_gpus))
    return out


HAND = [("a", 10, 100, 8), ("b", 20, 50, 2), ("c", 130, 10, 1), ("d", 240, 30, 1)]


def test_periodic_rounds_by_hand() -> None:
    jobs = [TraceJob(i, float(s), float(d), g) for i, s, d, g in HAND]
    # every event: a 10-110; b waits for it, 110-160; c 130-140; d 240-270
    assert starts(run(jobs, TWO_NODES, 0.0)) == {"a": 10, "b": 110, "c": 130, "d": 240}
    # every 60 s: a starts at the tick of 60 (runs to 160); b waits; c arrives at 130;
    # a ends at 160, so both start at the tick of 180; d arrives at 240, a tick itself
    want = {"a": 60, "b": 180, "c": 180, "d": 240}
    assert strict_fifo_on_ticks(jobs, 8, 60.0) == want  # the reference, checked by hand
    r = run(jobs, TWO_NODES, 60.0)
    assert starts(r) == want
    assert r.summary()["round_interval_s"] == 60.0
    assert "round_interval_s" not in run(jobs, TWO_NODES, 0.0).summary()


@pytest.mark.parametrize("seed", range(6))
def test_strict_fifo_on_ticks_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    dt = rng.choice([1.0, 7.0, 60.0, 300.0])
    jobs = [
        TraceJob(f"j{i}", float(rng.randrange(0, 3000)), float(rng.randrange(1, 400)),
                 rng.choice([1, 1, 2, 3, 4, 6, 8]))
        for i in range(80)
    ]  # fmt: skip
    assert starts(run(jobs, TWO_NODES, dt)) == strict_fifo_on_ticks(jobs, 8, dt)


@pytest.mark.parametrize("discipline", DISCIPLINES)
@pytest.mark.parametrize("policy", ["fifo", "sjf-est", "las"])
def test_starts_fall_on_ticks_and_no_later_than_needed(discipline: str, policy: str) -> None:
    """Every start is a tick at or after the job's submission; every job starts, and
    the GPUs in use never exceed the cluster (checked from the records)."""
    rng = random.Random(hash((discipline, policy)) & 0xFFFF)
    jobs = [
        TraceJob(f"j{i}", float(rng.randrange(0, 5000)), float(rng.randrange(1, 900)),
                 rng.choice([1, 1, 1, 2, 4, 8]), user=f"u{rng.randrange(4)}")
        for i in range(120)
    ]  # fmt: skip
    dt = 45.0
    r = run(jobs, TWO_NODES, dt, discipline, policy)
    got = starts(r)
    assert set(got) == {j.job_id for j in jobs}
    submit = {j.job_id: j.submit_s for j in jobs}
    for jid, t in got.items():
        assert t >= submit[jid]
        assert t == math.ceil(t / dt) * dt, (jid, t)
    edges = sorted(
        (t, g)
        for rec in r.records
        for seg in rec.segments
        for t, g in ((seg.start_s, rec.num_gpus), (seg.finish_s, -rec.num_gpus))
    )
    used = 0
    for _, g in edges:  # releases sort before grabs at one instant
        used += g
        assert used <= 8


def test_simulate_flag_on_a_real_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--limit", "300"]
    argv += ["--cluster", "clusters/philly.yaml", "--policy", "fifo", "--placer", "greedy"]
    assert main([*argv, "--round-interval", "600", "--json", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["round_interval_s"] == 600.0
    assert "rounds every 600 s" in capsys.readouterr().err
    assert main([*argv, "--round-interval", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rltune simulate: --round-interval must be 0 or more seconds, got -1"]


def test_fractional_intervals_never_start_a_job_before_it_arrives() -> None:
    """0.1 is not a binary fraction: a tick computed as ceil(t / 0.1) * 0.1 can round
    below t; the clock must never go back, nor a job start before its submission."""
    rng = random.Random(7)
    jobs = [
        TraceJob(f"j{i}", round(rng.uniform(0, 30), 3), round(rng.uniform(0.05, 3), 3),
                 rng.choice([1, 2, 4, 8]))
        for i in range(150)
    ]  # fmt: skip
    for dt in (0.1, 0.3, 7.3):
        r = run(jobs, TWO_NODES, dt, "easy", "fifo")
        submit = {j.job_id: j.submit_s for j in jobs}
        got = starts(r)
        assert len(got) == len(jobs)
        assert all(t >= submit[jid] for jid, t in got.items())
        assert all(abs(t / dt - round(t / dt)) < 1e-6 for t in got.values())
