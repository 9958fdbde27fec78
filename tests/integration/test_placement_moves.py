"""The placement service issues a re-placement move on the real broker: a run like
tests/services/placement/test_moves.py's (4-GPU nodes, three offloading jobs
sharing one, so that the default 25% gain is met) as messages on `cluster.nodes`,
`jobs.accepted`, `jobs.events` and `sched.priorities`; the move comes back in
`PlacementBatch.moves` on `sched.placements`, and an old consumer's decoder (the
batch without `moves`) still reads that batch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from services.placement import service as placement
from shared.bus import Producer, Record, read_back
from shared.config import BusSettings
from shared.messages import (
    Assignment,
    Job,
    JobEvent,
    NodeStatus,
    OffloadSpec,
    PlacementBatch,
    PriorityBatch,
    encode,
)
from shared.sched.replacement import ReplaceConfig, restart_cost_s
from tests.integration.streaming import services
from tests.services.placement.test_replace import GPT2XL, H

CLUSTER = """\
name: two
reference: V100
nodes:
  - {name: a, gpu_type: V100, gpus: 4, pcie_gbps: 16, nvme_gbps: 3}
  - {name: b, gpu_type: V100, gpus: 4, pcie_gbps: 16, nvme_gbps: 3}
"""


class _OldBatch(msgspec.Struct):
    """PlacementBatch as consumers built before `moves` decode it."""

    round_id: int
    time: float
    assignments: list[Assignment]


async def _batch(bus: BusSettings, p: Producer, rid: int, t: float, jobs: list[str]) -> Record:
    """Send round `rid` and wait for its PlacementBatch."""
    prio = PriorityBatch(rid, t, [(j, float(len(jobs) - i)) for i, j in enumerate(jobs)])
    await (await p.send(bus.topics.sched_priorities, str(rid), encode(prio)))
    for _ in range(240):
        recs: list[Record] = []
        await read_back(bus, [bus.topics.sched_placements], recs.append)
        for r in recs:
            if msgspec.json.decode(r.value or b"", type=PlacementBatch).round_id == rid:
                return r
        await asyncio.sleep(0.25)
    raise AssertionError(f"no placement for round {rid}")


async def _send(bus: BusSettings, p: Producer, topic: str, key: str, msg: msgspec.Struct) -> None:
    await (await p.send(topic, key, encode(msg)))


@pytest.mark.timeout(240)
async def test_the_service_sends_a_move_on_the_placements_topic(
    bus: BusSettings, tmp_path: Path
) -> None:
    spec = tmp_path / "two.yaml"
    spec.write_text(CLUSTER)
    conf = placement.PlacementSettings(
        "greedy+offload+replace", str(spec), reproducible=True, discipline="easy"
    )
    t = bus.topics
    dec = msgspec.json.Decoder(PlacementBatch)
    runs = {"placement": lambda stop: placement.serve(bus, stop, conf=conf)}
    async with services(bus, runs), Producer(bus) as p:
        for n in ("a", "b"):
            await _send(bus, p, t.cluster_nodes, n, NodeStatus(n, "V100", 4, [0, 1, 2, 3]))
        await _send(bus, p, t.jobs_accepted, "z", Job("z", 4, 0.0))
        for j in ("w", "x", "y"):
            job = Job(j, 1, 1.0, duration_hint_s=H, offload=OffloadSpec(GPT2XL))
            await _send(bus, p, t.jobs_accepted, j, job)
        await asyncio.sleep(1.0)  # (the service reads the topics in any order)
        first = dec.decode((await _batch(bus, p, 1, 0.0, ["z"])).value or b"")
        (zn,) = {a.node_id for a in first.assignments}
        await _send(bus, p, t.jobs_events, "z", JobEvent("z", "started", 0.0, [zn]))
        # the executor's status after z started (the service's view is only its own
        # bookkeeping until then)
        await _send(bus, p, t.cluster_nodes, zn, NodeStatus(zn, "V100", 4, []))
        await asyncio.sleep(1.0)
        second = dec.decode((await _batch(bus, p, 2, 1.0, ["w", "x", "y"])).value or b"")
        other = ({"a", "b"} - {zn}).pop()
        assert {a.node_id for a in second.assignments} == {other} and not second.moves
        for j in ("w", "x", "y"):
            await _send(bus, p, t.jobs_events, j, JobEvent(j, "started", 1.0, [other]))
        await _send(bus, p, t.cluster_nodes, other, NodeStatus(other, "V100", 4, [3]))
        await _send(bus, p, t.jobs_events, "z", JobEvent("z", "finished", 8 * H, [zn]))
        await _send(bus, p, t.cluster_nodes, zn, NodeStatus(zn, "V100", 4, [0, 1, 2, 3]))
        await asyncio.sleep(1.0)
        rec = await _batch(bus, p, 3, 8 * H, [])
    batch = dec.decode(rec.value or b"")
    # w, x, y share one node's link (slowdown 2.37 each); the first candidate by
    # elapsed, then id, is w: alone on z's node it runs at 1.46 (the 25% default gain)
    assert [(m.job_id, [a.node_id for a in m.assignments]) for m in batch.moves] == [("w", [zn])]
    assert batch.moves[0].restart_s == pytest.approx(restart_cost_s(GPT2XL, ReplaceConfig()))
    assert batch.moves[0].saved_s > 0
    old = msgspec.json.decode(rec.value or b"", type=_OldBatch)  # unknown fields ignored
    assert old.round_id == 3 and old.assignments == []
