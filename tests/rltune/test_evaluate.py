"""`rltune eval`: table and plots for several policies on one small trace."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from rltune import main
from rltune.evaluate import jobs_file
from tests.paths import RLTUNE_TRACE

ROOT = Path(__file__).resolve().parents[2]
RLTUNE = RLTUNE_TRACE


def test_eval_writes_table_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "nodes:\n"
        "  - {name: t4, count: 2, gpu_type: T4, gpus: 4}\n"
        "  - {name: v100, count: 2, gpu_type: V100M32, gpus: 8}\n"
        "  - {name: p100, count: 2, gpu_type: P100, gpus: 4}\n"
        "  - {name: misc, count: 1, gpu_type: MISC, gpus: 8}\n"
    )
    out = tmp_path / "out"
    argv = ["eval", "--trace", str(RLTUNE), "--format", "rltune", "--cluster", str(cluster)]
    assert main([*argv, "--policies", "fifo,sjf-oracle,smallest", "--out", str(out)]) == 0
    md = (out / "summary.md").read_text()
    assert "| sjf-oracle (oracle) |" in md and "| fifo |" in md
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["policy"] for r in rows] == ["fifo", "sjf-oracle (oracle)", "smallest"]
    assert all(int(r["jobs"]) + sum(
        int(x.split("=")[1]) for x in r["rejected"].split(";") if x
    ) == 960 for r in rows)  # fmt: skip
    for name in (
        "jct_cdf.png",
        "queue_delay.png",
        "gpu_util.png",
        "queue_by_size.png",
        "jobs-fifo.csv",
    ):
        assert (out / name).stat().st_size > 1000
    assert (out / "jct_cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_checks_every_policy_name_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", "--trace", "x.csv", "--format", "philly", "--cluster", "c.yaml"]
    assert main([*argv, "--policies", "fifo,sjf", "--out", str(tmp_path)]) == 2
    assert "unknown policy 'sjf'" in capsys.readouterr().err


def test_jobs_file_names_stay_in_the_output_folder() -> None:
    assert jobs_file("fifo") == "jobs-fifo.csv"
    assert jobs_file("sjf-oracle") == "jobs-sjf-oracle.csv"
    assert jobs_file("rl") == "jobs-rl.csv"
    assert jobs_file("rl:models/rl.pt") == "jobs-rl_rl.csv"
    assert jobs_file("rl:/tmp/a b/x.v2.pt") == "jobs-rl_x.v2.csv"


def _one_job(tmp_path: Path) -> tuple[Path, Path]:
    """(a JSON-lines trace of one 5 s 1-GPU job, a cluster of one 2-GPU node) in tmp_path."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"job_id": "a", "num_gpus": 1, "duration_s": 5}\n')
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {name: n, gpu_type: P100, gpus: 2}\n")
    return trace, cluster


def test_a_policy_named_twice_and_a_directory_for_a_cluster_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, cluster = _one_job(tmp_path)
    argv = ["eval", "--trace", str(trace), "--format", "jsonl", "--out", str(tmp_path / "o")]
    assert main([*argv, "--cluster", str(cluster), "--policies", "fifo,drf,fifo"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "rltune eval: --policies names fifo twice: each runs once"
    ]
    assert main([*argv, "--cluster", str(tmp_path), "--policies", "fifo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rltune eval: cluster file {tmp_path} is a directory: give a YAML file or "
                   "an openb CSV"]  # fmt: skip


def test_a_previous_runs_per_job_files_do_not_stay_beside_this_ones_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, cluster = _one_job(tmp_path)
    out = tmp_path / "o"
    argv = ["eval", "--trace", str(trace), "--format", "jsonl", "--cluster", str(cluster)]
    assert main([*argv, "--policies", "fifo,drf", "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    assert main([*argv, "--policies", "drf", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("jobs-*.csv")) == ["jobs-drf.csv"]
    assert (out / "notes.txt").read_text() == "mine"  # only eval's own files go
    assert "removed jobs-fifo.csv" in capsys.readouterr().err
    assert main([*argv, "--policies", "fifo", "--no-jobs", "--out", str(out)]) == 0
    assert not list(out.glob("jobs-*.csv"))
