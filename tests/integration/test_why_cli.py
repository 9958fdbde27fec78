"""`rltune why` on the real broker: the answer read back from the topics equals the
one the pure state gives for the same records; an unknown job and an unreachable
broker are one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from msgspec import Struct

from rltune import main
from services.scoring.why import WhyState
from shared.bus import Producer
from shared.config import BusSettings
from shared.messages import Job, JobEvent, KillRequest, NodeStatus, encode
from shared.wire import Record
from tests.services.scoring.test_why import _cluster


async def test_why_reads_the_topics(
    bus: BusSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    msgs = [(topic.replace("rltune.", bus.topic_prefix, 1), m) for topic, m in _cluster()]
    ref = WhyState(bus.topics)
    async with Producer(bus) as p:
        for i, (topic, m) in enumerate(msgs):
            await (await p.send(topic, None, encode(m)))
            ref.add(Record(topic, 0, i, None, encode(m)))
    bus_args = ["--bootstrap", bus.bootstrap, "--topic-prefix", bus.topic_prefix]
    out = tmp_path / "why.json"
    assert await _main(["why", "target", "--json", str(out), *bus_args]) == 0
    printed = capsys.readouterr().out
    want = ref.explain("target")
    assert printed == "\n".join(want.lines) + "\n"
    got = json.loads(out.read_text())
    assert (got["eta_s"], got["eta_alone_s"], got["ahead"]) == (1150.0, 1100.0, ["q1"])
    assert await _main(["why", "nope", *bus_args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no job nope on" in err
    dead = ["--bootstrap", "127.0.0.1:1", "--topic-prefix", bus.topic_prefix]
    assert await _main(["why", "target", *dead]) == 2
    assert "cannot reach a Kafka broker at 127.0.0.1:1" in capsys.readouterr().err


async def _main(argv: list[str]) -> int:
    import asyncio

    return await asyncio.to_thread(main, argv)


QUEUES_YAML = """\
name: c
nodes:
  - {name: a, gpu_type: GPU, gpus: 4}
  - {name: b, gpu_type: GPU, gpus: 4}
queues:
  research: {guaranteed_gpus: 4, limit_gpus: 6}
  nlp: {parent: research, guaranteed_gpus: 2, limit_gpus: 4}
  cv: {parent: research, guaranteed_gpus: 2}
  prod: {guaranteed_gpus: 4}
priority_classes:
  serve: {priority: 100, preemptible: false}
  train: {priority: 10, preemptible: true}
"""


async def test_why_names_the_queue_rule_from_the_cluster_file(
    bus: BusSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reclaim state of test_why_queues on the real broker (its jobs.kill request
    included): with --cluster the answer says it waits for reclaim and who is stopping."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(QUEUES_YAML)
    t = bus.topics
    running = [
        ("n1", "nlp", 2, "a"),
        ("c1", "cv", 2, "a"),
        ("d1", "x", 2, "b"),
        ("d2", "x", 2, "b"),
    ]
    msgs: list[tuple[str, Struct]] = []
    for jid, vc, gpus, node in running:
        msgs += [(t.jobs_accepted, Job(jid, gpus, 0.0, vc=vc))]
        msgs += [(t.jobs_events, JobEvent(jid, "started", 0.0, [node]))]
    msgs += [(t.cluster_nodes, NodeStatus(n, "GPU", 4, [], time=100.0)) for n in ("a", "b")]
    msgs += [(t.jobs_accepted, Job("p", 2, 50.0, vc="prod"))]
    msgs += [(t.jobs_kill, KillRequest("d2", "reclaim for p", requeue=True, grace_s=120.0))]
    async with Producer(bus) as p:
        for topic, m in msgs:
            await (await p.send(topic, None, encode(m)))
    bus_args = ["--bootstrap", bus.bootstrap, "--topic-prefix", bus.topic_prefix]
    out = tmp_path / "why.json"
    argv = ["why", "p", "--cluster", str(cluster), "--json", str(out), *bus_args]
    assert await _main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "waiting for reclaim: it fits inside prod's unused guarantee (4 of 4 GPUs unused)"
    ) in printed
    assert "; being stopped now: d2 (reclaim for p)\n" in printed
    assert json.loads(out.read_text())["rule"] == "reclaim"
    # without the cluster file no queue rule is named
    assert await _main(["why", "p", *bus_args]) == 0
    assert "reclaim" not in capsys.readouterr().out
    assert await _main(["why", "p", "--cluster", "/nonexistent.yaml", *bus_args]) == 2
    assert "cluster file not found" in capsys.readouterr().err
