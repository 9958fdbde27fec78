"""`rltune bench bus` end to end on a small load: every path measured, ratios from the rates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.integration  # starts a broker in a subprocess
def test_bench_bus_reports_three_paths_and_their_ratios(tmp_path: Path) -> None:
    out = tmp_path / "bus.json"
    r = subprocess.run(
        [sys.executable, "-m", "rltune", "bench", "bus", "--messages", "2000",
         "--rounds", "1", "--json", str(out), "--latency-rates", ""],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["messages"] == 2000 and res["rounds"] == 1
    for key in ("raw_msgs_per_s", "relay_msgs_per_s", "arrival_jobs_per_s"):
        assert res[key] > 0
    assert res["ratio"] == round(res["arrival_jobs_per_s"] / res["raw_msgs_per_s"], 3)
    assert res["ratio_vs_relay"] == round(res["arrival_jobs_per_s"] / res["relay_msgs_per_s"], 3)
    assert "arrival: submit→arrival→accepted" in r.stdout
    assert res["latency"] == []  # (the latency runs: tests/integration/test_latency.py)
