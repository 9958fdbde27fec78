"""`rltune bench offload_placement --jobs-out`: every figure of its table comes back
from the per-job CSVs (recomputed independently), and the project's checker passes
on each run."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltune import main
from tests.paths import TOOLS
from tests.shared.sim.jobs_check import recompute_offload

ROOT = Path(__file__).resolve().parents[2]


def test_table_recomputed_from_jobs_out(tmp_path: Path) -> None:
    argv = ["bench", "offload_placement", "--trace", str(ROOT / "examples" / "philly-2000.jsonl"),
            "--format", "jsonl", "--cluster", str(ROOT / "clusters" / "philly.yaml"),
            "--limit", "150", "--placers", "greedy,greedy+offload",
            "--jobs-out", str(tmp_path / "jobs"), "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    table = json.loads((tmp_path / "offload_placement.json").read_text())["placers"]
    assert set(table) == {"greedy", "greedy+offload"}
    for name, row in table.items():
        path = tmp_path / "jobs" / f"{name}.csv"
        got = recompute_offload(path)
        assert got["offload_jobs"] == row["offload_jobs"] > 0
        for key in ("offload_avg_jct_s", "offload_migration_s", "offload_slowdown"):
            assert got[key] == pytest.approx(row[key], rel=1e-9), (name, key)
        jct: dict[str, float] = {}  # job -> finish − submit, and who offloads
        offloads: set[str] = set()
        with path.open(newline="") as fh:
            for r in csv.DictReader(fh):
                if r["finish_s"]:
                    jct[r["job_id"]] = max(jct.get(r["job_id"], 0.0),
                                           float(r["finish_s"]) - float(r["submit_s"]))  # fmt: skip
                if r["param_bytes"]:
                    offloads.add(r["job_id"])
        assert row["avg_jct_s"] == pytest.approx(sum(jct.values()) / len(jct), rel=1e-9)
        others = [v for k, v in jct.items() if k not in offloads]
        assert row["others_avg_jct_s"] == pytest.approx(sum(others) / len(others), rel=1e-9)
        summary = tmp_path / "jobs" / f"{name}.json"
        done = subprocess.run([sys.executable, str(TOOLS / "check_jobs.py"), str(path),
                               str(summary)], capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
