"""bench/offload_seeds.py: changes against the unaware twin and the target count,
from hand-made result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.offload_seeds import main, rows


def _row(slowdown: float, others: float, offloading: float, moves: int = 0) -> dict[str, float]:
    return {"offload_slowdown": slowdown, "others_avg_jct_s": others,
            "offload_avg_jct_s": offloading, "avg_jct_s": (others + offloading) / 2,
            "replacements": moves}  # fmt: skip


def _write(d: Path, seed: int, placers: dict[str, dict[str, float]]) -> str:
    d.mkdir()
    data = {"marking": f"offload: 30% of jobs ... (seed {seed}), ...", "placers": placers}
    (d / "offload_placement.json").write_text(json.dumps(data))
    return str(d)


def test_cuts_against_the_unaware_twin_and_the_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _write(tmp_path / "a", 3, {
        "milp": _row(0.5, 100.0, 200.0),
        "milp+offload+replace": _row(0.3, 99.0, 150.0, 7),  # −40%, both groups faster: met
        "greedy": _row(0.4, 100.0, 100.0),
        "greedy+offload": _row(0.2, 101.0, 90.0),  # −50% but the others +1%: not met
    })  # fmt: skip
    b = _write(tmp_path / "b", 4, {
        "milp": _row(0.5, 100.0, 200.0),
        "milp+offload+replace": _row(0.4, 90.0, 150.0),  # −20%: not met
    })  # fmt: skip
    datas = [json.loads(Path(d, "offload_placement.json").read_text()) for d in (a, b)]
    got = {(r["seed"], r["placer"]): r for r in rows(datas)}
    r = got[("3", "milp+offload+replace")]
    assert r["d_slowdown"] == pytest.approx(-0.4) and r["d_others"] == pytest.approx(-0.01)
    assert r["moves"] == 7 and "d_slowdown" not in got[("3", "milp")]
    assert got[("3", "greedy+offload")]["d_slowdown"] == pytest.approx(-0.5)
    assert main([a, b, "--out", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "`milp+offload+replace` vs `milp` over 2 seeds: mean cut 30.0%, smallest 20.0%" in out
    assert "met at 1; avg JCT of the jobs that do not offload higher at 0" in out
    assert "`greedy+offload` vs `greedy` over 1 seeds: mean cut 50.0%" in out
    assert "met at 0; avg JCT of the jobs that do not offload higher at 1" in out
    assert (tmp_path / "p.png").stat().st_size > 0
    assert main([str(tmp_path / "missing")]) == 2
