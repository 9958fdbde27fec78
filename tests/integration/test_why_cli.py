"""`rltune why` on the real broker: the answer read back from the topics equals the
one the pure state gives for the same records; an unknown job and an unreachable
broker are one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltune import main
from services.scoring.why import WhyState
from shared.bus import Producer
from shared.config import BusSettings
from shared.messages import encode
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
