"""`rltune bench sim` runs and prints jobs/s side by side with the ratio."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.cli import main

TRACE = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "traces"
    / "philly"
    / "philly-sep-oct.csv"
)


@pytest.mark.skipif(not TRACE.exists(), reason="no Philly trace beside the checkout")
def test_bench_sim_prints_rates_and_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--limit", "3000", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "fifo:" in out and "sjf-est:" in out and "jobs/s best" in out
    assert "ratio sjf-est / fifo:" in out
