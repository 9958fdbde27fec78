"""The readers of traces that name who submitted what (`swf`, `alcf`) and of ITP: files
in the public layouts written here with rows whose expected jobs are worked out by
hand, and a smoke run on the first rows of the real files."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pytest

from shared.cluster import load_cluster
from shared.errors import UserError
from shared.traces import SkipStats, TraceJob
from shared.traces.registry import open_trace
from shared.traces.swf import SLOT_TYPE, swf_cluster
from tests.paths import ITP, KTH_SWF, LLNL_SWF, THETAGPU

CLUSTERS = Path(__file__).resolve().parents[3] / "clusters"


def read(path: Path, fmt: str) -> tuple[list[TraceJob], SkipStats]:
    stats = SkipStats()
    return list(open_trace(path, fmt, None, stats)), stats


SWF = """\
; Version: 2.2
; UnixStartTime: 1000
; MaxNodes: 4
; MaxProcs: 32
;
    1        0   10   3600    8   -1 -1    8   7200 -1 1  3  7  12 0 -1 -1 -1
    2       60   -1     -1   -1   -1 -1   16   3600 -1 5  4  7  13 0 -1 -1 -1
    3      120    5    300   -1   -1 -1    4     -1 -1 0  3 -1  -1 -1 -1 -1 -1
    4      180    5    100   -1   -1 -1   -1     60 -1 1  5  8  14 1 -1 -1 -1
    5      240    5     -1    2   -1 -1    2    600 -1 1  5  8  14 1 -1 -1 -1
    6      300    5    50     2   -1 -1    2
    7      360    0    40    16   -1 -1   -1    900 -1 5  6  9  15 2 -1 -1 -1
"""


def swf_expected() -> list[TraceJob]:
    # row 1: requested procs 8 (field 8), run 3600, requested 7200 s, user 3, group 7,
    #        executable 12, queue 0, submit 1000 + 0
    # row 2: cancelled (status 5) and never ran: skipped
    # row 3: requested procs 4; no requested time (-1); user 3, no group or executable
    # row 4: no processor count at all: skipped
    # row 5: run time -1 (unknown): skipped
    # row 6: 8 fields, not 18: bad row
    # row 7: cancelled after running 40 s: kept, allocated 16 procs (requested -1)
    return [
        TraceJob("1", 1000.0, 3600.0, 8, user="3", vc="0", project="7", app="12",
                 time_limit_s=7200.0),
        TraceJob("3", 1120.0, 300.0, 4, user="3"),
        TraceJob("7", 1360.0, 40.0, 16, user="6", vc="2", project="9", app="15",
                 time_limit_s=900.0),
    ]  # fmt: skip


@pytest.mark.parametrize("packed", [False, True])
def test_swf_by_hand_plain_and_gzipped(tmp_path: Path, packed: bool) -> None:
    p = tmp_path / ("log.swf.gz" if packed else "log.swf")
    p.write_bytes(gzip.compress(SWF.encode()) if packed else SWF.encode())
    jobs, stats = read(p, "swf")
    assert jobs == swf_expected()
    assert stats.counts == {
        "cancelled, never ran": 1, "no processors": 1, "no run time": 1, "bad row": 1
    }  # fmt: skip
    cluster = swf_cluster(p)  # 4 nodes of 32 / 4 = 8 slots
    assert [(n.gpu_type, n.gpus) for n in cluster.nodes] == [(SLOT_TYPE, 8)] * 4


def test_swf_header_without_sizes_needs_a_cluster(tmp_path: Path) -> None:
    p = tmp_path / "bare.swf"
    p.write_text("; Version: 2.2\n" + SWF.splitlines()[5] + "\n")
    with pytest.raises(UserError, match="MaxNodes or MaxProcs"):
        swf_cluster(p)
    p.write_text("; MaxProcs: 3\n")  # procs only: one-slot nodes
    assert [n.gpus for n in swf_cluster(p).nodes] == [1, 1, 1]


ALCF = """\
,job,user,project,state,gpu_num,cpu_num,node_num,submit_time,wait_time,run_time,wall_time,node_hour,new_status
0,101,24166353244411.0,33510060530859.0,0,1.0,0,1.0,1672529197.0,5.0,2305.54,3600.0,0.64,Pass
1,102,0.0,0.0,0,2.0,0,2.0,1672529437.0,6.0,3602.3,3600.0,2.0,Failed
2,103,7.0,0.0,0,0.0,0,0.0,1672529500.0,6.0,10.0,600.0,0.0,Failed
3,104,7.0,0.0,0,1.0,0,1.0,1672529600.0,6.0,-1,600.0,0.0,Failed
4,105,7.0,0.0,0,1.0,0,1.0,oops,6.0,10,600.0,0.0,Failed
"""


def test_alcf_nodes_are_dgx_of_eight_gpus_and_wall_time_is_the_request(tmp_path: Path) -> None:
    p = tmp_path / "thetagpu.csv"
    p.write_text(ALCF)
    jobs, stats = read(p, "alcf")
    assert jobs == [
        # 1 node = 8 A100 GPUs; wall_time is the requested time; user/project as given
        TraceJob("101", 1672529197.0, 2305.54, 8, gpu_types=("A100",),
                 user="24166353244411.0", project="33510060530859.0", time_limit_s=3600.0),
        # 2 nodes = 16 GPUs; user and project 0.0 mean "not given"
        TraceJob("102", 1672529437.0, 3602.3, 16, gpu_types=("A100",), time_limit_s=3600.0),
    ]  # fmt: skip
    assert stats.counts == {"zero GPUs": 1, "no run time": 1, "bad row": 1}


def test_alcf_refuses_another_layout(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="not an ALCF job log"):
        read(p, "alcf")


def test_itp_by_hand(tmp_path: Path) -> None:
    p = tmp_path / "cluster09.csv"
    p.write_text(
        "job_id,submission_time,duration,num_gpu\n"
        "a-1,100,2429,64\n"
        "b-2,150,1532,1\n"
        "c-3,160,20,0\n"
        "d-4,170,-5,1\n"
        "e-5,180,x,1\n"
        "f-6,190,7,2,9\n"
    )
    jobs, stats = read(p, "itp")
    assert jobs == [TraceJob("a-1", 100.0, 2429.0, 64), TraceJob("b-2", 150.0, 1532.0, 1)]
    assert stats.counts == {"zero GPUs": 1, "bad row": 3}
    p.write_text("id,when\n1,2\n")
    with pytest.raises(UserError, match="not an ITP trace"):
        read(p, "itp")


def first(path: Path, fmt: str, n: int = 200) -> list[TraceJob]:
    return list(itertools.islice(open_trace(path, fmt, None, SkipStats()), n))


def test_real_files_first_rows() -> None:
    kth = first(KTH_SWF, "swf")
    # the log's first job: 56 procs, run 97225 s, requested 210000 s, user 1, group 1
    assert kth[0] == TraceJob("1", 843480031.0, 97225.0, 56, user="1", project="1",
                              time_limit_s=210000.0)  # fmt: skip
    assert all(j.time_limit_s and j.user for j in kth)
    assert max(j.num_gpus for j in kth) <= 100
    llnl = first(LLNL_SWF, "swf")
    assert all(j.num_gpus <= 9216 and j.duration_s is not None for j in llnl)
    theta = first(THETAGPU, "alcf")
    assert theta[0].num_gpus == 8 and theta[0].time_limit_s == 3600.0
    assert all(j.num_gpus % 8 == 0 and j.time_limit_s for j in theta)
    for i in range(1, 6):
        itp = first(ITP / f"cluster0{i}.csv", "itp")
        assert itp and all(j.num_gpus >= 1 and not j.user for j in itp)


def test_shipped_clusters_hold_each_traces_largest_job() -> None:
    """Every job of each real trace fits the cluster shipped for it (nothing is
    rejected as too large for the whole cluster)."""
    cases = [(KTH_SWF, "swf", "kth-sp2"), (LLNL_SWF, "swf", "llnl-atlas"),
             (THETAGPU, "alcf", "thetagpu")]  # fmt: skip
    cases += [(ITP / f"cluster0{i}.csv", "itp", f"itp-cluster0{i}") for i in range(1, 6)]
    for path, fmt, name in cases:
        cluster = load_cluster(CLUSTERS / f"{name}.yaml")
        biggest = max(j.num_gpus for j in open_trace(path, fmt, None, SkipStats()))
        assert biggest <= cluster.total_gpus, name
    assert swf_cluster(KTH_SWF).total_gpus == 100
    assert swf_cluster(LLNL_SWF).total_gpus == 9216
