"""Trace readers on files in the exact public layouts, written here, and on slices
of the real traces beside the checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.traces import SkipStats, TraceJob
from shared.traces.registry import FORMATS, open_trace
from tests.paths import ALIBABA_2023, PHILLY, RLTUNE_TRACE


def read(path: Path, fmt: str, cluster: object = None) -> tuple[list[TraceJob], SkipStats]:
    stats = SkipStats()
    return list(open_trace(path, fmt, cluster, stats)), stats  # type: ignore[arg-type]


def test_philly_csv_slice_and_garbage(tmp_path: Path) -> None:
    lines = PHILLY.read_text().splitlines()[:6]  # header + 5 real rows
    lines += ["garbage", "2017-09-30 01:02:03,abc,1,1,x", "2017-09-30 01:02:03,5.0,0,0,x", ""]
    lines += ["2017-10-01 00:00:00,60.0,2,120.0,vcz"]
    p = tmp_path / "philly.csv"
    p.write_text("\n".join(lines) + "\n")
    jobs, stats = read(p, "philly")
    assert [j.job_id for j in jobs] == [f"philly-{i}" for i in (1, 2, 3, 4, 5, 10)]
    assert jobs[0] == TraceJob("philly-1", 1504521041.0, 2240194.0, 8, vc="7f04ca")
    assert jobs[-1].submit_s == 1506816000.0 and jobs[-1].num_gpus == 2
    assert stats.counts == {"bad row": 2, "zero GPUs": 1}


def test_philly_raw_json_attempts(tmp_path: Path) -> None:
    log = [
        {"status": "Pass", "vc": "vc1", "jobid": "application_1", "user": "u1",
         "submitted_time": "2017-10-07 13:07:53",
         "attempts": [
             {"start_time": "2017-10-07 13:08:00", "end_time": "2017-10-07 13:09:00",
              "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}, {"ip": "m2", "gpus": ["gpu3"]}]},
             {"start_time": "2017-10-07 14:00:00", "end_time": "2017-10-07 14:00:30",
              "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1", "gpu2"]}]}]},
        {"status": "Running", "vc": "vc1", "jobid": "application_2", "user": "u1",
         "submitted_time": "2017-10-07 13:07:53", "attempts": []},
        {"status": "Killed", "vc": "vc2", "jobid": "application_3", "user": "u2",
         "submitted_time": "2017-10-07 13:07:53", "attempts": []},
        {"status": "Failed", "vc": "vc2", "jobid": "application_4", "user": "u2",
         "submitted_time": "2017-10-07 13:07:53",
         "attempts": [{"start_time": "2017-10-07 13:08:00", "end_time": "None", "detail": []}]},
        {"status": "Pass", "vc": "vc2", "jobid": "application_5", "submitted_time": "nonsense",
         "attempts": [{"start_time": "x", "end_time": "y", "detail": []}]},
    ]  # fmt: skip
    p = tmp_path / "cluster_job_log"
    p.write_text(json.dumps(log, indent=1))
    jobs, stats = read(p, "philly")
    assert jobs == [TraceJob("application_1", 1507381673.0, 90.0, 3, user="u1", vc="vc1")]
    assert stats.counts == {"unfinished": 2, "never ran": 1, "bad row": 1}


def test_philly_raw_json_truncated_file_counts_one_bad_row(tmp_path: Path) -> None:
    one = {"status": "Pass", "vc": "v", "jobid": "a", "submitted_time": "2017-10-07 13:07:53",
           "attempts": [{"start_time": "2017-10-07 13:08:00", "end_time": "2017-10-07 13:08:10",
                         "detail": [{"ip": "m", "gpus": ["gpu0"]}]}]}  # fmt: skip
    p = tmp_path / "log.json"
    p.write_text("[" + json.dumps(one) + ", " + json.dumps(one)[:40])
    jobs, stats = read(p, "philly")
    assert len(jobs) == 1 and stats.counts == {"bad row": 1}


def test_helios_cluster_log(tmp_path: Path) -> None:
    p = tmp_path / "cluster_log.csv"
    p.write_text(
        "job_id,user,vc,gpu_num,cpu_num,node_num,state,"
        "submit_time,start_time,end_time,duration,queue\n"
        "j1,u1,vcA,8,64,1,COMPLETED,"
        "2020-04-01 00:00:10,2020-04-01 00:01:10,2020-04-01 01:01:10,3600,60\n"
        "j2,u1,vcA,0,4,1,COMPLETED,"
        "2020-04-01 00:00:11,2020-04-01 00:00:11,2020-04-01 00:00:20,9,0\n"
        "j3,u2,vcB,1,4,1,RUNNING,2020-04-01 00:00:12,2020-04-01 00:00:12,,,0\n"
        "j4,u2,vcB,2,4,1,CANCELLED,"
        "2020-04-01 00:00:13,2020-04-01 00:00:14,2020-04-01 00:00:20,6,1\n"
        "j5,u2,vcB,two,4,1,COMPLETED,2020-04-01 00:00:13,,,6,1\n"
    )
    jobs, stats = read(p, "helios")
    assert jobs == [
        TraceJob("j1", 1585699210.0, 3600.0, 8, user="u1", vc="vcA"),
        TraceJob("j4", 1585699213.0, 6.0, 2, user="u2", vc="vcB"),
    ]
    assert stats.counts == {"zero GPUs": 1, "unfinished": 1, "bad row": 1}


def test_alibaba2020_job_and_task_tables(tmp_path: Path) -> None:
    (tmp_path / "pai_job_table.csv").write_text(
        "j1,i1,u1,Terminated,100,500\n"
        "j2,i2,u1,Terminated,110,300\n"
        "j3,i3,u2,Running,120,\n"
        "j4,i4,u2,Terminated,130,200\n"
        "j5,i5,u2,Terminated,1e400,200\n"
    )
    (tmp_path / "pai_task_table.csv").write_text(
        "j1,worker,2,Terminated,150,450,600,29.3,100,V100\n"
        "j1,ps,1,Terminated,140,460,600,29.3,,\n"
        "j2,worker,1,Terminated,120,290,600,29.3,50,T4\n"
        "j3,worker,1,Running,130,,600,29.3,100,P100\n"
        "j4,worker,1,Terminated,130,200,600,29.3,,\n"
        "j5,worker,3,Terminated,130,200,600,29.3,50,MISC\n"
    )
    jobs, stats = read(tmp_path / "pai_job_table.csv", "alibaba2020")
    assert jobs == [
        TraceJob("j1", 100.0, 300.0, 2, gpu_types=("V100",), user="u1"),
        TraceJob("j2", 110.0, 170.0, 1, gpu_milli=500, gpu_types=("T4",), user="u1"),
    ]
    assert stats.counts == {"unfinished": 1, "zero GPUs": 1, "bad row": 1}
    jobs_dir, _ = read(tmp_path, "alibaba2020")
    assert jobs_dir == jobs


def test_rltune_real_file_and_type_codes(tmp_path: Path) -> None:
    jobs, stats = read(RLTUNE_TRACE, "rltune")
    assert len(jobs) == 960 and stats.total == 0
    assert jobs[0] == TraceJob("deepspeech2-0_1", 1201.0, 25.0, 8, gpu_types=("T4",), user="2")
    row = "a,10,0,{run},{n},-1,-1,-1,-1,-1,2,7,2,-1,0,-1,-1,{vc},{code}\n"
    p = tmp_path / "t.csv"
    p.write_text(
        row.format(run=5, n=1, vc=3, code=4)
        + row.format(run=-1, n=1, vc=3, code=4)
        + row.format(run=5, n=0, vc=3, code=4)
        + row.format(run=5, n=1, vc=-1, code=9)
        + "short,row\n"
        + row.format(run=5, n=2, vc=-1, code=-1)
    )
    jobs, stats = read(p, "rltune")
    assert jobs == [
        TraceJob("a", 10.0, 5.0, 1, gpu_types=("V100_32GB",), user="7", vc="3"),
        TraceJob("a", 10.0, 5.0, 2, user="7"),
    ]
    assert stats.counts == {"unfinished": 1, "zero GPUs": 1, "bad row": 2}


def test_jsonl_validates_each_line(tmp_path: Path) -> None:
    p = tmp_path / "jobs.jsonl"
    p.write_text(
        '{"job_id": "a", "num_gpus": 2, "gpu_types": ["V100"], '
        '"submit_time": 5, "duration_s": 60}\n'
        '{"job_id": "b", "num_gpus": 1, "gpu_milli": 250, "duration_s": 1, "weight": 2}\n'
        "\n"
        '{"job_id": "bad id!", "num_gpus": 1, "duration_s": 1}\n'
        '{"job_id": "c", "num_gpus": 0, "duration_s": 1}\n'
        '{"job_id": "d", "num_gpus": 1}\n'
        "not json\n"
    )
    jobs, stats = read(p, "jsonl")
    assert jobs == [
        TraceJob("a", 5.0, 60.0, 2, gpu_types=("V100",)),
        TraceJob("b", 0.0, 1.0, 1, gpu_milli=250, weight=2.0),
    ]
    assert stats.counts["no duration_s"] == 1
    assert sum(n for r, n in stats.counts.items() if r.startswith("bad row")) == 3


def test_type_names_map_onto_the_cluster(tmp_path: Path) -> None:
    spec = parse_cluster(
        {"nodes": [
            {"name": "a", "gpu_type": "V100M16", "gpus": 1},
            {"name": "b", "gpu_type": "V100M32", "gpus": 1},
            {"name": "c", "gpu_type": "t4", "gpus": 1},
        ]}
    )  # fmt: skip
    p = tmp_path / "jobs.jsonl"
    lines = [["V100_16GB"], ["V100"], ["T4"], ["TPU"], ["v100-32gb", "T4"], []]
    p.write_text(
        "".join(
            json.dumps({"job_id": f"j{i}", "num_gpus": 1, "gpu_types": t, "duration_s": 1}) + "\n"
            for i, t in enumerate(lines)
        )
    )
    jobs, _ = read(p, "jsonl", spec)
    assert [j.gpu_types for j in jobs] == [
        ("V100M16",),
        ("V100M16", "V100M32"),
        ("t4",),
        ("TPU",),  # no such GPU: kept, and the simulator rejects it with a reason
        ("V100M32", "t4"),
        (),
    ]


def test_alibaba2023_is_registered() -> None:
    assert set(FORMATS) == {
        "philly", "helios", "alibaba2020", "alibaba2023", "rltune", "jsonl", "swf", "alcf", "itp"
    }  # fmt: skip
    jobs, stats = read(ALIBABA_2023 / "openb_pod_list_default.csv", "alibaba2023")
    assert len(jobs) + stats.total == 8152


def test_bad_paths_and_formats(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        read(tmp_path / "nope.csv", "philly")
    with pytest.raises(UserError, match="unknown trace format 'csv'"):
        read(tmp_path / "nope.csv", "csv")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="not a Philly CSV"):
        read(tmp_path / "x.csv", "philly")
    with pytest.raises(UserError, match="not a Helios"):
        read(tmp_path / "x.csv", "helios")
    with pytest.raises(UserError, match="task table"):
        read(tmp_path / "x.csv", "alibaba2020")


def test_jsonl_refuses_what_arrival_refuses_and_reads_past_a_byte_order_mark(
    tmp_path: Path,
) -> None:
    """A share of a GPU on several GPUs is refused (not made whole), a job id read
    before is skipped (a per-job file has one job per id), and a file that starts
    with a UTF-8 byte-order mark keeps its first job."""
    p = tmp_path / "jobs.jsonl"
    p.write_bytes(
        b"\xef\xbb\xbf"
        + b'{"job_id": "a", "num_gpus": 1, "duration_s": 60}\n'
        + b'{"job_id": "b", "num_gpus": 4, "gpu_milli": 500, "duration_s": 60}\n'
        + b'{"job_id": "a", "num_gpus": 2, "duration_s": 30}\n'
        + b'{"job_id": "c", "num_gpus": 1, "gpu_milli": 500, "duration_s": 10}\n'
    )
    jobs, stats = read(p, "jsonl")
    assert jobs == [TraceJob("a", 0.0, 60.0, 1), TraceJob("c", 0.0, 10.0, 1, gpu_milli=500)]
    assert stats.counts["duplicate job_id"] == 1
    assert stats.counts["bad row (gpu_milli < 1000, a share of one GPU, needs num_gpus 1)"] == 1
    assert sum(stats.counts.values()) == 2
