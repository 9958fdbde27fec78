"""bench/offload_waits.py: wait changes of the jobs that do not offload, per size group
and submit day, on hand-made per-job CSVs (values worked out by hand below)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.offload_waits import gpu_hours, load, main, summary

HEADER = (
    "job_id,vc,submit_s,start_s,finish_s,num_gpus,gpu_milli,gpu_type,nodes,"
    "param_bytes,offload_s,restart_s\n"
)
DAY = 86400.0  # submit 0 is 1970-01-01 UTC


def _csv(path: Path, rows: list[tuple[str, float, float, float, int, str]]) -> Path:
    text = HEADER + "".join(
        f"{j},vc,{sub},{start},{fin},{g},1000,P100,n:0,{pb},{'1.0' if pb else ''},"
        f"{'0.0' if pb else ''}\n"
        for j, sub, start, fin, g, pb in rows
    )
    path.write_text(text)
    return path


def test_hand_solved_groups_and_days(tmp_path: Path) -> None:
    base = _csv(tmp_path / "base.csv", [
        ("a", 0.0, 3600.0, 9000.0, 1, ""),  # 1 GPU, waits 1 h
        ("b", 0.0, 0.0, 100.0, 1, ""),  # 1 GPU, waits 0
        ("c", DAY, DAY + 7200.0, DAY + 9000.0, 8, ""),  # 8 GPUs, waits 2 h
        ("d", 0.0, 0.0, 50.0, 4, "3000000000"),  # offloads: left out
        ("e", 0.0, 0.0, 10.0, 2, ""),  # 2-7, waits 0
    ])  # fmt: skip
    other = _csv(tmp_path / "other.csv", [
        ("a", 0.0, 3 * 3600.0, 9000.0, 1, ""),  # +2 h
        ("b", 0.0, 3600.0, 5000.0, 1, ""),  # +1 h
        ("c", DAY, DAY, DAY + 1800.0, 8, ""),  # -2 h
        ("d", 0.0, 9e5, 9e5 + 1.0, 4, "3000000000"),  # offloads: would add 250 h
        ("d", 0.0, 9e6, 9e6 + 1.0, 4, "3000000000"),  # a later segment
        ("e", 0.0, 0.0, 10.0, 2, ""),
    ])  # fmt: skip
    groups, days = summary(load(base), load(other), days=5)
    assert groups["1"] == pytest.approx(
        {"jobs": 2, "base_h": 0.5, "other_h": 2.0, "change_h": 1.5, "jct_part_s": 3 * 3600 / 4}
    )
    assert groups["8+"] == pytest.approx(
        {"jobs": 1, "base_h": 2.0, "other_h": 0.0, "change_h": -2.0, "jct_part_s": -7200 / 4}
    )
    assert groups["2-7"]["change_h"] == 0.0 and groups["2-7"]["jobs"] == 1
    assert days == [
        ("1970-01-01", {"one_h": 3.0, "one_jobs": 2, "rest_h": 0.0, "rest_jobs": 1}),
        ("1970-01-02", {"one_h": 0.0, "one_jobs": 0, "rest_h": -2.0, "rest_jobs": 1}),
    ]


def test_the_groups_add_up_to_the_avg_jct_change_when_run_times_match(tmp_path: Path) -> None:
    """Property: with every job's run time the same in both runs, the groups' parts sum to
    the change of the avg JCT of the jobs that do not offload (computed directly)."""
    rng = random.Random(7)
    for trial in range(20):
        rows_a, rows_b = [], []
        for i in range(rng.randint(1, 40)):
            sub, run = rng.uniform(0, 5 * DAY), rng.uniform(1, 1e5)
            g = rng.choice([1, 1, 1, 2, 4, 8, 16])
            pb = "1000" if rng.random() < 0.3 else ""
            wa, wb = rng.uniform(0, 1e5), rng.uniform(0, 1e5)
            rows_a.append((f"j{i}", sub, sub + wa, sub + wa + run, g, pb))
            rows_b.append((f"j{i}", sub, sub + wb, sub + wb + run, g, pb))
        a = load(_csv(tmp_path / f"a{trial}.csv", rows_a))
        b = load(_csv(tmp_path / f"b{trial}.csv", rows_b))
        groups, _ = summary(a, b)
        ids = [r[0] for r in rows_a if not r[5]]
        if not ids:
            continue
        jct = {r[0]: r[3] - r[1] for r in rows_a}
        jct_b = {r[0]: r[3] - r[1] for r in rows_b}
        direct = sum(jct_b[k] - jct[k] for k in ids) / len(ids)
        assert sum(g["jct_part_s"] for g in groups.values()) == pytest.approx(direct, abs=1e-6)


def test_a_bad_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,vc\nx,y\n")
    assert main([str(bad), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read") and err.count("\n") == 1


def test_gpu_hours_of_restore_and_migration(tmp_path: Path) -> None:
    path = tmp_path / "j.csv"
    path.write_text(
        HEADER
        + "a,vc,0,0,9000,2,1000,P100,n:0+1,5,1800.0,0.0\n"  # 2 GPUs x 0.5 h migration
        + "a,vc,0,9000,20000,2,1000,P100,m:0+1,5,0.0,360.0\n"  # 2 x 0.1 h restore
        + "b,vc,0,0,10,1,1000,P100,n:2,,,\n"  # no offload: empty cells
    )
    assert gpu_hours(path) == pytest.approx((0.2, 1.0))
