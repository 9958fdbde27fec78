"""`rltune up` / `rltune metrics`: the operator's view of the latest snapshots."""

from __future__ import annotations

from rich.console import Console

from shared.cli.up import view
from shared.messages import MetricsSnapshot


def _render(latest: dict[str, MetricsSnapshot]) -> list[str]:
    console = Console(width=200, record=True)
    console.print(view(latest, rounds_per_s=0.0))
    return console.export_text().splitlines()


def test_an_idle_profiler_says_where_profiles_come_from_and_a_busy_one_does_not() -> None:
    latest = {
        "profiler": MetricsSnapshot(source="profiler", counters={"consumed": 0, "published": 0}),
        "scoring": MetricsSnapshot(source="scoring", counters={"consumed": 7, "published": 7}),
    }
    lines = _render(latest)
    (prof,) = [ln for ln in lines if ln.lstrip().startswith("profiler")]
    (score,) = [ln for ln in lines if ln.lstrip().startswith("scoring")]
    assert "in 0  out 0" in prof and "no profiles yet" in prof
    assert "in 7  out 7" in score and "no profiles yet" not in score
    latest["profiler"] = MetricsSnapshot(source="profiler", counters={"consumed": 2})
    (prof,) = [ln for ln in _render(latest) if ln.lstrip().startswith("profiler")]
    assert "in 2" in prof and "no profiles yet" not in prof
