"""The openb pod list reader, on rows in the public layout and on the real files."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from shared.errors import UserError
from shared.traces import SkipStats
from shared.traces.alibaba2023 import read_alibaba2023
from tests.paths import ALIBABA_2023

TRACES = ALIBABA_2023
HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def _write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    p = tmp_path / "pods.csv"
    p.write_text(header + body)
    return p


def test_fields_shares_types_and_durations(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "pod-a,12000,16384,1,1000,,LS,Running,0,100,10\n"
        "pod-b,6000,12288,1,460,V100M16|V100M32|V100M32,BE,Succeeded,5,50,7\n"
        "pod-c,4000,1024,0,0,,BE,Running,6,60,6\n"
        "pod-d,32000,1024,8,1000,G2,LS,Pending,9,99,\n"
        "pod-e,1,1,x,1000,,LS,Running,1,2,1\n",
    )
    stats = SkipStats()
    jobs = list(read_alibaba2023(p, stats))
    assert [j.job_id for j in jobs] == ["pod-a", "pod-b", "pod-d"]
    a, b, d = jobs
    assert (a.submit_s, a.duration_s, a.num_gpus, a.gpu_milli, a.gpu_types) == (
        0.0,
        90.0,
        1,
        1000,
        (),
    )
    assert (b.gpu_milli, b.gpu_types, b.duration_s) == (460, ("V100M16", "V100M32"), 43.0)
    assert (d.num_gpus, d.gpu_types, d.duration_s) == (8, ("G2",), None)
    assert stats.counts == {"zero GPUs": 1, "bad row": 1}


def test_type_map_renames(tmp_path: Path) -> None:
    p = _write(tmp_path, "pod-a,1,1,1,1000,V100M16|T4,LS,Running,0,1,0\n")
    (job,) = read_alibaba2023(p, SkipStats(), type_map={"V100M16": "V100"})
    assert job.gpu_types == ("T4", "V100")


def test_packing_list_without_time_columns(tmp_path: Path) -> None:
    p = _write(
        tmp_path, "pod-a,1000,1024,4,1000\n", header="name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    )
    (job,) = read_alibaba2023(p, SkipStats())
    assert (job.submit_s, job.duration_s, job.num_gpus) == (0.0, None, 4)


def test_not_a_pod_list(tmp_path: Path) -> None:
    p = _write(tmp_path, "", header="sn,gpu,model\n")
    with pytest.raises(UserError, match="missing columns"):
        list(read_alibaba2023(p, SkipStats()))
    with pytest.raises(UserError, match="cannot read"):
        list(read_alibaba2023(tmp_path / "nope.csv", SkipStats()))


def test_real_default_list() -> None:
    stats = SkipStats()
    jobs = list(read_alibaba2023(TRACES / "openb_pod_list_default.csv", stats))
    assert len(jobs) + stats.total == 8152
    assert stats.counts["zero GPUs"] == 1088
    # a second reading of the same file with the csv module alone
    with (TRACES / "openb_pod_list_default.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["num_gpu"] or 0) > 0]
    assert [j.job_id for j in jobs] == [r["name"] for r in rows]  # 7,064 pods, in file order
    assert sum(1 for j in jobs if j.gpu_milli < 1000) == sum(
        1 for r in rows if int(r["gpu_milli"] or 1000) < 1000
    )  # 3,078 GPU-sharing pods
    assert all(j.num_gpus in (1, 2, 4, 8) for j in jobs)
    never_ran = sum(1 for r in rows if not r["scheduled_time"] or not r["deletion_time"])
    assert sum(1 for j in jobs if j.duration_s is None) == never_ran == 861
