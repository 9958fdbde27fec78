"""`rltune simulate`'s reclaim flags reach the simulator: the hand-worked schedule of
tests/shared/sim/test_reclaim.py through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltune import main

CLUSTER = """\
nodes:
  - {name: n, gpu_type: P100, gpus: 8}
queues:
  A: {guaranteed_gpus: 4}
  B: {guaranteed_gpus: 4}
"""
# B borrows A's idle half at 0 for 10000 s; A's 4-GPU job (1000 s) comes at 100
TRACE = [
    {"job_id": "b1", "num_gpus": 8, "vc": "B", "submit_time": 0, "duration_s": 10000},
    {"job_id": "a1", "num_gpus": 4, "vc": "A", "submit_time": 100, "duration_s": 1000},
]


def _run(tmp: Path, *flags: str) -> dict[str, object]:
    (tmp / "c.yaml").write_text(CLUSTER)
    (tmp / "t.jsonl").write_text("".join(json.dumps(j) + "\n" for j in TRACE))
    out = tmp / "s.json"
    argv = ["simulate", "--trace", str(tmp / "t.jsonl"), "--format", "jsonl", "--cluster"]
    argv += [str(tmp / "c.yaml"), "--policy", "fifo", "--placer", "greedy", "--json", str(out)]
    assert main([*argv, *flags]) == 0
    return json.loads(out.read_text())


def test_defaults_flags_and_off(tmp_path: Path) -> None:
    # defaults: decided at 600 (b1's minimum run), stopped at 720, all 720 s lost
    s = _run(tmp_path)
    assert s["preemptions"] == 1 and s["restart_lost_gpu_h"] == 8 * 720 / 3600
    assert s["reclaim"] == {"grace_s": 120.0, "min_run_s": 600.0, "checkpoint_s": 1800.0}
    # no grace, no minimum run: stopped at a1's arrival (100), 100 s lost
    s = _run(tmp_path, "--grace", "0", "--min-run", "0")
    assert s["restart_lost_gpu_h"] == 8 * 100 / 3600
    # checkpoints every 300 s: at 720, 120 s lost
    assert _run(tmp_path, "--checkpoint", "300")["restart_lost_gpu_h"] == 8 * 120 / 3600
    # off: no preemption, no reclaim keys; a1 waits for b1
    s = _run(tmp_path, "--no-reclaim")
    assert "preemptions" not in s and s["max_queue_s"] == 10000 - 100


@pytest.mark.parametrize("flag", ["--grace", "--min-run", "--checkpoint"])
def test_bad_values_one_line_exit_2(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "t.jsonl").write_text(json.dumps(TRACE[0]) + "\n")
    argv = ["simulate", "--trace", str(tmp_path / "t.jsonl"), "--format", "jsonl"]
    argv += ["--cluster", str(tmp_path / "c.yaml"), "--policy", "fifo", flag, "-5"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0]
