"""`rltune bench placement` on the real cluster, tiny: the JSON keys of DESIGN.md and
the plot."""

from __future__ import annotations

import json
from pathlib import Path

from bench import placement
from tests.paths import ALIBABA_2023

TRACES = ALIBABA_2023
KEYS = {"window", "solve_p50_ms", "solve_p99_ms", "gap_vs_exact", "timeouts"}


def test_json_keys(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    argv = ["--windows", "16", "--fills", "0.3", "--samples", "2", "--exact-limit", "1"]
    png = tmp_path / "p.png"
    assert placement.main([*argv, "--json", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (row,) = json.loads(out.read_text())
    assert set(row) >= KEYS and row["window"] == 16 and row["windows"] == 2
    assert row["gap_vs_exact"] >= 0 and row["solve_p99_ms"] >= row["solve_p50_ms"] > 0
