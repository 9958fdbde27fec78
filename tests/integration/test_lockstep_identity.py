"""Identity over the bus: ThetaGPU jobs published on `jobs.submit` with their user,
project and requested wall time, run in lockstep through arrival, scoring, placement
and cluster-sim, start exactly when `rltune simulate` starts them, for the policies
that read the request (`sjf-req`) and the wait against it (`wfp3`), EASY reserving
with the user's last runs capped by the request on both paths."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rltune import main
from services.cluster_sim import service as cluster_sim
from shared.bus import Producer
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.messages import encode
from shared.replay import job_spec_of
from shared.sim import load_jobs
from shared.traces import SkipStats
from tests.integration.streaming import lockstep_runs, services
from tests.paths import THETAGPU

LIMIT = 80  # the 80 first ThetaGPU jobs queue on two DGX nodes (one asks for more: rejected)


async def publish(bus: BusSettings, cluster: Path) -> None:
    jobs = load_jobs(THETAGPU, "alcf", load_cluster(cluster), SkipStats(), LIMIT)
    async with Producer(bus) as p:
        for j in jobs:
            spec = job_spec_of(j)
            assert spec.time_limit_s and spec.time_limit_s == j.time_limit_s
            spec.submit_time = j.submit_s
            await p.send(bus.topics.jobs_submit, spec.job_id, encode(spec))
        await p.flush()


@pytest.mark.parametrize("policy", ["sjf-req", "wfp3"])
async def test_lockstep_with_identity_same_start_times_as_simulate(
    bus: BusSettings, tmp_path: Path, policy: str
) -> None:
    cluster = tmp_path / "dgx2.yaml"
    cluster.write_text("nodes:\n  - {name: dgx, count: 2, gpu_type: A100, gpus: 8}\n")
    await publish(bus, cluster)
    runs = lockstep_runs(bus, cluster, policy, "milp", LIMIT, tmp_path)
    conf = cluster_sim.SimSettings(
        trace=str(THETAGPU), format="alcf", cluster=str(cluster), policy=policy,
        placer="milp", limit=LIMIT, lockstep=True, json_out=str(tmp_path / "up.json"),
        jobs_out=str(tmp_path / "up.csv"), exit_when_done=True,
    )  # fmt: skip
    runs["cluster-sim"] = lambda stop: cluster_sim.serve(bus, stop, conf=conf)
    async with services(bus, runs) as tasks:
        await asyncio.wait_for(tasks["cluster-sim"], 240)
    out = tmp_path / "sim.csv"
    argv = ["simulate", "--trace", str(THETAGPU), "--format", "alcf", "--cluster", str(cluster)]
    assert main([*argv, "--policy", policy, "--limit", str(LIMIT), "--jobs-out", str(out)]) == 0
    expected = out.read_text()
    rows = [line.split(",") for line in expected.splitlines()[1:]]
    assert sum(1 for r in rows if r[3] and float(r[3]) > float(r[2])) > 10  # jobs queued
    assert (tmp_path / "up.csv").read_text() == expected
