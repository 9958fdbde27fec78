"""Reclaim over the bus: with team guarantees in the cluster file, lockstep through
arrival, scoring, placement and cluster-sim gives `rltune simulate`'s per-job CSV,
preempted segments and their lost seconds included, and the same reclaim figures in
the summary. The simulator decides every preemption (shared/sim/reclaim.py); the bus
carries each as a `preempted` event on `jobs.events`, and the reclaiming job's start
as a round of its own. Two queue arrangements: flat team guarantees, and two orgs
with limits at both levels and a per-type guarantee."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from rltune import main
from shared.bus import Record, read_back
from shared.config import BusSettings
from shared.messages import JobEvent
from tests.integration.streaming import SMALL_CLUSTER, lockstep_runs, publish_trace, services
from tests.paths import PHILLY

LIMIT = 60
FLAT = 'queues:\n  "6214e9": {guaranteed_gpus: 6}\n  "b436b2": {guaranteed_gpus: 6}\n'
ORGS = """\
queues:
  research: {guaranteed_gpus: 8, limit_gpus: 12}
  "6214e9": {parent: research, guaranteed_gpus: 3, limit_gpus: 8}
  "7f04ca": {parent: research, guaranteed_gpus: 4}
  product: {guaranteed_gpus: 6}
  "b436b2": {parent: product, guaranteed_gpus: {V100: 4}}
"""


DEFAULTS = {"grace_s": 120.0, "min_run_s": 600.0, "checkpoint_s": 1800.0}
SETTINGS = {"grace_s": 60.0, "min_run_s": 300.0, "checkpoint_s": 900.0}
FLAGS = {"grace_s": "--grace", "min_run_s": "--min-run", "checkpoint_s": "--checkpoint"}


@pytest.mark.parametrize(
    ("queues", "policy", "at_least", "settings"),
    [(FLAT, "sjf-est", 5, {}), (ORGS, "fifo", 2, {}), (ORGS, "sjf-est", 5, SETTINGS)],
    ids=["flat", "two-orgs", "two-orgs-settings"],
)
async def test_lockstep_reclaim_same_csv_as_simulate(
    bus: BusSettings,
    tmp_path: Path,
    queues: str,
    policy: str,
    at_least: int,
    settings: dict[str, float],
) -> None:
    cluster = tmp_path / "small-queues.yaml"
    cluster.write_text(SMALL_CLUSTER + queues)
    await publish_trace(bus, cluster, LIMIT)
    runs = lockstep_runs(bus, cluster, policy, "milp", LIMIT, tmp_path, reclaim=settings)
    async with services(bus, runs) as tasks:
        await asyncio.wait_for(tasks["cluster-sim"], 240)
    out, js = tmp_path / "sim.csv", tmp_path / "sim.json"
    argv = ["simulate", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(cluster)]
    argv += ["--policy", policy, "--limit", str(LIMIT), "--jobs-out", str(out), "--json", str(js)]
    argv += [x for k, v in settings.items() for x in (FLAGS[k], str(v))]
    assert main(argv) == 0
    expected = out.read_text()
    header, *lines = expected.splitlines()
    rows = [line.split(",") for line in lines]
    assert header.endswith(",lost_s")
    # preemptions happened (a segment that is not its job's last), so the test is not vacuous
    ids = [r[0] for r in rows]
    stopped = len(ids) - len(set(ids))
    assert stopped >= at_least
    assert sum(1 for r in rows if r[-1] and float(r[-1]) > 0) >= at_least
    assert (tmp_path / "up.csv").read_text() == expected
    up, sim = json.loads((tmp_path / "up.json").read_text()), json.loads(js.read_text())
    for key in ("jobs", "preemptions", "restart_lost_gpu_h", "reclaim", "avg_jct_s"):
        assert up[key] == sim[key], key
    assert sim["reclaim"] == {**DEFAULTS, **settings}  # (the settings reached both runs)
    assert sim["preemptions"] == stopped
    # every stop went out on jobs.events as `preempted`, once per stopped segment
    recs: list[Record] = []
    await read_back(bus, [bus.topics.jobs_events], recs.append)
    events = [msgspec.json.decode(r.value or b"", type=JobEvent) for r in recs]
    preempted = sorted(e.job_id for e in events if e.kind == "preempted")
    # (a job's rows: one per segment; every one but its last ended in a preemption)
    assert preempted == sorted(j for j in set(ids) for _ in range(ids.count(j) - 1))
