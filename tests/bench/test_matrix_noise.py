"""`rltune bench matrix_noise`: the perturbation (replica 0 is the cell itself; the
others delay each job by at most the jitter, keep every job or drop about the share
asked, and depend only on the replica), replica 0's ratios equal to those of
`rltune eval --matrix` on the same cell (the matrix module's own run), and the
command's tables, files and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.matrix_noise import main, perturb
from rltune.matrix import HEURISTICS, load_matrix, ratios, run_matrix
from shared.errors import UserError
from shared.traces import TraceJob
from tests.paths import THETAGPU

ROOT = Path(__file__).resolve().parents[2]


def _jobs(n: int = 400) -> list[TraceJob]:
    return [TraceJob(f"j{i}", float(i * 3), 100.0 + i, 1 + i % 4) for i in range(n)]


def test_replica_zero_is_the_cell_and_the_others_only_delay() -> None:
    jobs = _jobs()
    assert perturb(jobs, 0, 10.0, 0.5) == jobs
    for r in (1, 2, 7):
        got = perturb(jobs, r, 10.0, 0.0)
        assert got == perturb(jobs, r, 10.0, 0.0)  # the replica alone decides it
        assert [j.submit_s for j in got] == sorted(j.submit_s for j in got)
        by_id = {j.job_id: j for j in jobs}
        assert sorted(j.job_id for j in got) == sorted(by_id)  # every job, once
        for j in got:
            delay = j.submit_s - by_id[j.job_id].submit_s
            assert 0.0 <= delay <= 10.0
            assert (j.duration_s, j.num_gpus) == (
                by_id[j.job_id].duration_s,
                by_id[j.job_id].num_gpus,
            )
        # some pairs submitted 3 s apart change order: the perturbation is not empty
        assert [j.job_id for j in got] != [j.job_id for j in jobs]
    assert perturb(jobs, 1, 10.0, 0.0) != perturb(jobs, 2, 10.0, 0.0)
    kept = [len(perturb(jobs, r, 0.0, 0.25)) for r in range(1, 9)]
    assert all(250 <= k <= 350 for k in kept), kept  # about 300 of 400
    assert perturb(jobs, 3, 0.0, 0.0) == jobs  # no jitter, no drop: the cell


def _matrix(tmp_path: Path) -> Path:
    m = tmp_path / "m.yaml"
    m.write_text(
        f"- {{name: theta, trace: {THETAGPU}, format: alcf, cluster: "
        f"{ROOT / 'clusters' / 'thetagpu.yaml'}, fraction: [0.5, 1.0], limit: 150, load: 0.9}}\n"
    )
    return m


def test_replica_zero_matches_the_matrix_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = _matrix(tmp_path)
    argv = ["--matrix", str(m), "--policies", "f1-unicep,f1", "--replicas", "2"]
    assert main([*argv, "--placer", "greedy", "--out", str(tmp_path / "o")]) == 0
    got = json.loads((tmp_path / "o" / "noise.json").read_text())
    reps = got["cells"]["theta"]
    assert len(reps) == 2
    ref = ratios(run_matrix(load_matrix(m), list(HEURISTICS), placer="greedy")[0])
    assert reps[0]["best"] == ref.best
    assert reps[0]["bsld"]["f1-unicep"] == pytest.approx(ref.bsld["f1-unicep"], rel=1e-12)
    assert reps[0]["bsld"] == pytest.approx(ref.bsld, rel=1e-12)
    assert min(reps[1]["bsld"].values()) == 1.0  # the replica's own best
    assert (tmp_path / "o" / "noise.png").stat().st_size > 0
    out = capsys.readouterr().out
    md = (tmp_path / "o" / "noise.md").read_text()
    assert md.startswith("`rltune bench matrix_noise --matrix ")
    assert md.split("\n", 2)[2] == out  # the tables printed
    assert "| f1-unicep / f1 |" in out.splitlines()[2]  # the pair's column
    assert "| f1-unicep | " in out


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--replicas", "0"], "--replicas 0"),
        (["--jitter-s", "-1"], "--jitter-s -1"),
        (["--drop", "1"], "--drop 1"),
        (["--policies", "nope"], "unknown policy 'nope'"),
    ],
)
def test_bad_arguments_name_the_problem(tmp_path: Path, extra: list[str], says: str) -> None:
    with pytest.raises(UserError, match=says):
        main(["--matrix", str(_matrix(tmp_path)), *extra])
