"""`--since` / `--until`: simulate and eval only the jobs submitted in a time slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltune import main


def _files(tmp: Path) -> tuple[Path, Path]:
    lines = [
        json.dumps({"job_id": f"j{i}", "submit_time": 100.0 * i, "num_gpus": 1, "duration_s": 50})
        for i in range(10)
    ]
    trace = tmp / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    cluster = tmp / "c.yaml"
    cluster.write_text("nodes:\n  - {name: n, gpu_type: P100, gpus: 1}\n")
    return trace, cluster


def test_since_until_pick_the_slice(tmp_path: Path) -> None:
    trace, cluster = _files(tmp_path)
    out = tmp_path / "s.json"
    argv = ["simulate", "--trace", str(trace), "--format", "jsonl", "--cluster", str(cluster)]
    argv += ["--policy", "fifo", "--placer", "greedy", "--json", str(out)]
    assert main([*argv, "--since", "300", "--until", "700"]) == 0
    assert json.loads(out.read_text())["jobs"] == 4  # submitted at 300, 400, 500, 600
    assert main([*argv, "--since", "300", "--limit", "2"]) == 0
    assert json.loads(out.read_text())["jobs"] == 2


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--since", "2017-13-01"], "--since '2017-13-01'"),
        (["--since", "5000"], "no job submitted"),
    ],
)
def test_bad_slice_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    trace, cluster = _files(tmp_path)
    argv = ["simulate", "--trace", str(trace), "--format", "jsonl", "--cluster", str(cluster)]
    assert main([*argv, "--policy", "fifo", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
