"""Arrival on the real broker with a cluster file: a job's `priority_class` must name
one of the file's priority classes; an unknown one is answered on `jobs.rejected`
with a reason naming the field, and a job with a known class, or none, is accepted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from services.arrival import service as arrival
from shared.config import BusSettings
from tests.integration.arrival_load import collect_answers, produce
from tests.integration.streaming import SMALL_CLUSTER

CLASSES = """\
priority_classes:
  serve: {priority: 100, preemptible: false}
  train: {priority: 10}
"""


async def test_an_unknown_priority_class_is_rejected_naming_the_field(
    bus: BusSettings, tmp_path: Path
) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(SMALL_CLUSTER + CLASSES)
    stop, ready = asyncio.Event(), asyncio.Event()
    conf = arrival.ArrivalSettings(cluster=str(cluster))
    task = asyncio.create_task(arrival.serve(bus, stop, ready, conf=conf))
    await asyncio.wait_for(ready.wait(), 30)
    specs = [
        {"job_id": "known", "num_gpus": 1, "priority_class": "serve"},
        {"job_id": "typo", "num_gpus": 1, "priority_class": "Serve"},
        {"job_id": "plain", "num_gpus": 1},
        {"job_id": "other", "num_gpus": 2, "priority_class": "batch"},
    ]
    await produce(bus, [json.dumps(s).encode() for s in specs])
    got = await collect_answers(bus, len(specs), timeout_s=60)
    stop.set()
    stats = await asyncio.wait_for(task, 30)
    assert dict(got.accepted) == {"known": 1, "plain": 1}
    assert sorted(json.loads(raw)["job_id"] for raw in got.rejected) == ["other", "typo"]
    assert sorted(got.reasons) == [
        "priority_class 'Serve' is not a priority class of this cluster (it has serve, train)",
        "priority_class 'batch' is not a priority class of this cluster (it has serve, train)",
    ]
    assert stats.rejected == {"unknown_class": 2}
