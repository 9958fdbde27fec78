"""`rltune bench sim` runs and prints greedy and MILP jobs/s side by side with the ratio."""

from __future__ import annotations

import re

import pytest

from shared.cli import main


def test_bench_sim_prints_greedy_and_milp_rates_and_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "sim", "--limit", "1500", "--policies", "fifo"]) == 0
    out = capsys.readouterr().out
    best = {
        m["placer"]: int(m["rate"].replace(",", ""))
        for m in re.finditer(r"fifo\s+(?P<placer>[\w-]+):\s+(?P<rate>[\d,]+) jobs/s best", out)
    }
    assert set(best) == {"greedy", "milp"} and all(v > 0 for v in best.values())
    assert "discipline easy" in out and "0 inversions" in out
    ratio = re.search(r"ratio milp / greedy \(fifo\): (\d+\.\d+)", out)
    assert ratio is not None
    # printed to two places from the same rates
    assert abs(float(ratio[1]) - best["milp"] / best["greedy"]) <= 0.005 + 1e-9
