"""Test fixtures: a real Kafka-protocol broker (the embedded Tansu) for the session,
and per test a topic prefix of its own with every topic created."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.broker import EmbeddedBroker, ensure_topics
from shared.config import BusSettings

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
_counter = itertools.count()


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """`../shared/traces` beside the checkout (the real traces)."""
    if not TRACES.is_dir():
        pytest.fail(f"the real traces are expected at {TRACES}")
    return TRACES


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as b:
        yield b


@pytest.fixture
async def bus(broker: EmbeddedBroker) -> AsyncIterator[BusSettings]:
    """Settings for a fresh set of topics on the session broker."""
    settings = BusSettings(
        bootstrap=broker.bootstrap, topic_prefix=f"t{os.getpid()}x{next(_counter)}."
    )
    await ensure_topics(settings)
    yield settings
