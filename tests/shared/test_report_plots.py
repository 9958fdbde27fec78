"""The comparison plots' time axes: units that fit the span, bins that give points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.metrics import JobRecord, Segment
from shared.report import PolicyRun, _span_text, _unit, write_plots


@pytest.mark.parametrize(
    ("seconds", "unit"),
    [(0.0, "minutes"), (7199.0, "minutes"), (7200.0, "hours"), (172_799.0, "hours"),
     (172_800.0, "days"), (30 * 86400.0, "days")],
)  # fmt: skip
def test_units_by_span(seconds: float, unit: str) -> None:
    assert _unit(seconds)[1] == unit


def test_bin_text() -> None:
    assert _span_text(60.0) == "1.0 minute"
    assert _span_text(2868.0) == "47.8 minutes"
    assert _span_text(21_240.0) == "5.9 hours"
    assert _span_text(3 * 86400.0) == "3.0 days"


def test_a_trace_of_minutes_is_drawn_with_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thirteen jobs over twelve minutes: before, one-hour bins gave one point (blank
    plots); now a minute's bins give one per minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [
        JobRecord(f"j{i}", "vc", 60.0 * i, 1, segments=(Segment(60.0 * i + 30, 60.0 * i + 90),))
        for i in range(13)
    ]
    seen: list[int] = []
    real: Any = plt.Axes.plot

    def count(self: Any, *args: Any, **kw: Any) -> Any:
        seen.append(len(args[0]))
        return real(self, *args, **kw)

    monkeypatch.setattr(plt.Axes, "plot", count)
    paths = write_plots([PolicyRun("fifo", {}, records, 0.0, 4)], 4, tmp_path)
    assert [p.name for p in paths] == [
        "jct_cdf.png", "queue_delay.png", "gpu_util.png", "queue_by_size.png"
    ]  # fmt: skip
    # the JCT CDF's step, then queue delay and utilisation over time: many points each
    assert len(seen) == 3 and min(seen[1:]) >= 10
