"""`rltune bench sim` runs and prints greedy and MILP jobs/s side by side with the ratio."""

from __future__ import annotations

import re

import pytest

from rltune import main


def test_bench_sim_prints_greedy_and_milp_rates_and_ratio_per_discipline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "sim", "--limit", "1000", "--policies", "fifo"]
    assert main([*argv, "--disciplines", "strict,easy"]) == 0
    out = capsys.readouterr().out
    rows = re.finditer(
        r"(?P<disc>[\w-]+)\s+fifo\s+(?P<placer>[\w-]+):\s+(?P<rate>[\d,]+) jobs/s", out
    )
    best = {(m["disc"], m["placer"]): int(m["rate"].replace(",", "")) for m in rows}
    assert set(best) == {(d, p) for d in ("strict", "easy") for p in ("greedy", "milp")}
    assert all(v > 0 for v in best.values()) and out.count(" 0 inversions") == 4
    for d in ("strict", "easy"):
        ratio = re.search(rf"ratio milp / greedy \(fifo, {d}\): (\d+\.\d+)", out)
        assert ratio is not None
        # printed to two places from the same rates (each rounded to a whole job/s)
        want = best[(d, "milp")] / best[(d, "greedy")]
        assert abs(float(ratio[1]) - want) <= 0.005 + want / best[(d, "greedy")]


def test_bench_sim_unknown_discipline_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--limit", "10", "--disciplines", "fair"]) == 2
    assert "unknown discipline 'fair'" in capsys.readouterr().err
