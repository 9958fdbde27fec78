"""Default GPU speeds: the measured ones are what Gavel's file says."""

from __future__ import annotations

import pytest

from shared.speeds import DEFAULT_SPEEDS, gavel_speeds, speed_of
from tests.paths import GAVEL


def test_measured_speeds_come_from_gavel() -> None:
    measured = gavel_speeds(GAVEL)
    assert measured["P100"] == 1.0
    for t in ("K80", "P100", "V100"):
        assert DEFAULT_SPEEDS[t] == pytest.approx(measured[t], abs=1e-4)


def test_lookup_order() -> None:
    assert speed_of("V100", {"V100": 3.0}) == 3.0
    assert speed_of("V100M32", {}) == DEFAULT_SPEEDS["V100"]
    assert speed_of("A100") == pytest.approx(2 * DEFAULT_SPEEDS["V100"], abs=1e-3)
    assert speed_of("no-such-gpu") == 1.0
