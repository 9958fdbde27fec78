"""Helpers for the streaming-system tests: a small contended cluster, a real Philly
slice, and the services of one run started as tasks on the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from services.arrival import service as arrival
from services.cluster_sim import service as cluster_sim
from services.placement import service as placement
from services.scoring import service as scoring
from shared.bus import Producer
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.messages import encode
from shared.replay import job_spec_of
from shared.sim import load_jobs
from shared.traces import SkipStats
from tests.paths import PHILLY

SMALL_CLUSTER = """\
name: small
reference: P100
nodes:
  - {name: v100, count: 2, gpu_type: V100, gpus: 4}
  - {name: p100, count: 3, gpu_type: P100, gpus: 2}
"""


def small_cluster(tmp: Path) -> Path:
    path = tmp / "small.yaml"
    path.write_text(SMALL_CLUSTER)
    return path


async def publish_trace(settings: BusSettings, cluster: Path, limit: int) -> int:
    """Every job of the slice on `jobs.submit`, with its trace submit time."""
    jobs = load_jobs(PHILLY, "philly", load_cluster(cluster), SkipStats(), limit)
    async with Producer(settings) as p:
        outs = []
        for j in jobs:
            spec = job_spec_of(j)
            spec.submit_time = j.submit_s
            outs.append(spec)
        for spec in outs:
            await p.send(settings.topics.jobs_submit, spec.job_id, encode(spec))
        await p.flush()
    return len(jobs)


@contextlib.asynccontextmanager
async def services(
    settings: BusSettings, runs: Mapping[str, Callable[[asyncio.Event], Coroutine[Any, Any, Any]]]
) -> AsyncIterator[dict[str, asyncio.Task[Any]]]:
    stop = asyncio.Event()
    tasks = {name: asyncio.create_task(run(stop), name=name) for name, run in runs.items()}
    try:
        yield tasks
    finally:
        stop.set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


def lockstep_runs(
    settings: BusSettings,
    cluster: Path,
    policy: str,
    placer: str,
    limit: int,
    tmp: Path,
    offload_fraction: float = 0.0,
    preempt: bool = False,
    round_interval_s: float = 0.0,
    reclaim: Mapping[str, Any] | None = None,  # SimSettings' grace_s, min_run_s, ...
) -> dict[str, Callable[[asyncio.Event], Coroutine[Any, Any, Any]]]:
    sim_conf = cluster_sim.SimSettings(
        trace=str(PHILLY), format="philly", cluster=str(cluster), policy=policy, placer=placer,
        limit=limit, lockstep=True, json_out=str(tmp / "up.json"),
        jobs_out=str(tmp / "up.csv"), exit_when_done=True, offload_fraction=offload_fraction,
        preempt=preempt, round_interval_s=round_interval_s, **(reclaim or {}),
    )  # fmt: skip
    return {
        "arrival": lambda stop: arrival.serve(settings, stop),
        "scoring": lambda stop: scoring.serve(
            settings, stop, conf=scoring.ScoringSettings(policy, str(cluster), rounds="driven")
        ),
        "placement": lambda stop: placement.serve(
            settings, stop, conf=placement.PlacementSettings(placer, str(cluster), True)
        ),
        "cluster-sim": lambda stop: cluster_sim.serve(settings, stop, conf=sim_conf),
    }
