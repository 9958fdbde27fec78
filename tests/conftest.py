"""Test fixtures: a real Kafka-protocol broker (the embedded Tansu) for the session,
and per test a topic prefix of its own with every topic created."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from shared.broker import EmbeddedBroker, ensure_topics
from shared.config import BusSettings
from tests.paths import REQUIRED, SHARED

_counter = itertools.count()

# Hypothesis: under CI=true every run draws the same examples (derandomised, no example
# database), so a red build is the code's doing, never the draw's; elsewhere it searches
# freely and remembers what failed. Explicit @example cases run in both.
# (Both are built on hypothesis's own "default" profile: it loads its own "ci" profile
# whenever a CI variable is set at all, even to "".) Neither has a per-example deadline:
# these machines are shared and noisy, and a test must never fail on how busy they were.
_base = settings.get_profile("default")
settings.register_profile(
    "ci", _base, derandomize=True, database=None, print_blob=True, deadline=None
)
settings.register_profile("dev", _base, derandomize=False, print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI", "").lower() == "true" else "dev")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The tests run on the real traces: without them, stop with one clear line
    rather than skipping the tests that need them."""
    missing = [p for p in REQUIRED if not p.exists()]
    if missing:
        pytest.exit(
            f"the real traces are expected in {SHARED} (the project's shared folder beside "
            f"the checkout); missing: {', '.join(str(p) for p in missing)}",
            returncode=4,
        )


_INTEGRATION = Path(__file__).resolve().parent / "integration"
# fixtures that start a broker (a test that starts one in a subprocess is marked itself)
_BROKER_FIXTURES = {"broker", "own_broker"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`integration`: every test under tests/integration/ and every test on a broker, so
    that `pytest -m "not integration"` is the quick loop that starts none."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.path.is_relative_to(_INTEGRATION) or fixtures & _BROKER_FIXTURES:
            item.add_marker(pytest.mark.integration)


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
