"""`rltune bench sim` runs and prints jobs/s side by side with the ratio."""

from __future__ import annotations

import re

import pytest

from shared.cli import main


def test_bench_sim_prints_rates_and_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--limit", "3000", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    best = {
        m["policy"]: int(m["rate"].replace(",", ""))
        for m in re.finditer(r"(?P<policy>[\w-]+):\s+(?P<rate>[\d,]+) jobs/s best", out)
    }
    assert set(best) == {"fifo", "sjf-est"} and all(v > 0 for v in best.values())
    ratio = re.search(r"ratio sjf-est / fifo: (\d+\.\d+)", out)
    assert ratio is not None
    # printed to two places from the same rates (each rounded to a whole job/s)
    assert abs(float(ratio[1]) - best["sjf-est"] / best["fifo"]) <= 0.005 + 1e-3
