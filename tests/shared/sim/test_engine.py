"""The simulator on hand-made traces whose schedules are worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.placement.greedy import GreedyPlacer
from services.scoring.policies import make_policy
from shared.cluster import ClusterSpec, parse_cluster
from shared.metrics import Segment
from shared.sim import SimConfig, SimResult, read_jobs_csv, simulate, write_jobs_csv
from shared.traces import TraceJob


def cluster(*groups: dict, **extra: object) -> ClusterSpec:
    return parse_cluster({"nodes": list(groups), "reference": "P100", **extra})


def run(jobs: list[TraceJob], spec: ClusterSpec, policy: str = "fifo", **cfg: object) -> SimResult:
    return simulate(jobs, spec, make_policy(policy), GreedyPlacer(), SimConfig(**cfg))  # type: ignore[arg-type]


def segs(result: SimResult) -> dict[str, list[tuple[float, float]]]:
    return {r.job_id: [(s.start_s, s.finish_s) for s in r.segments] for r in result.records}


ONE_GPU = cluster({"name": "n", "gpu_type": "P100", "gpus": 1})
THREE = [TraceJob("A", 0, 10, 1), TraceJob("B", 1, 5, 1), TraceJob("C", 2, 1, 1)]


def test_fifo_by_hand() -> None:
    r = run(THREE, ONE_GPU)
    assert segs(r) == {"A": [(0, 10)], "B": [(10, 15)], "C": [(15, 16)]}
    s = r.summary()
    assert s["avg_jct_s"] == (10 + 14 + 14) / 3
    assert s["avg_queue_s"] == (0 + 9 + 13) / 3
    assert s["makespan_s"] == 16 and s["gpu_util"] == 1.0


def test_sjf_oracle_by_hand() -> None:
    r = run(THREE, ONE_GPU, "sjf-oracle")
    assert segs(r) == {"A": [(0, 10)], "B": [(11, 16)], "C": [(10, 11)]}
    assert r.summary()["avg_jct_s"] == (10 + 15 + 9) / 3


def test_sjf_est_learns_from_finished_jobs_only() -> None:
    # u's 1-GPU jobs: X (run 10) finishes first; then Y (u, 1 GPU, est 10) and Z (v, no history:
    # est 0) wait together, Z goes first though it is longer.
    jobs = [
        TraceJob("X", 0, 10, 1, user="u"),
        TraceJob("Y", 1, 10, 1, user="u"),
        TraceJob("Z", 2, 50, 1, user="v"),
    ]
    r = run(jobs, ONE_GPU, "sjf-est")
    assert segs(r) == {"X": [(0, 10)], "Z": [(10, 60)], "Y": [(60, 70)]}


def test_smallest_and_backfill_without_reservation() -> None:
    two = cluster({"name": "n", "gpu_type": "P100", "gpus": 2})
    jobs = [TraceJob("A", 0, 10, 1), TraceJob("B", 1, 10, 2), TraceJob("C", 2, 4, 1)]
    # fifo: B (2 GPUs) cannot start at 1; C fits the free GPU and starts at 2 (no reservation)
    r = run(jobs, two, discipline="best-effort")
    assert segs(r) == {"A": [(0, 10)], "B": [(10, 20)], "C": [(2, 6)]}
    # strict: C waits behind B; easy with no history (estimates of an hour): C would
    # hold a GPU past B's reservation at A's estimated end, so it waits as well
    for discipline in ("strict", "easy"):
        r = run(jobs, two, discipline=discipline)
        assert segs(r) == {"A": [(0, 10)], "B": [(10, 20)], "C": [(20, 24)]}
    assert segs(run(jobs, two, "smallest"))["B"] == [(10, 20)]


def test_run_time_scales_with_speed_and_slowest_type() -> None:
    spec = cluster(
        {"name": "v", "gpu_type": "V100", "gpus": 1},
        {"name": "p", "gpu_type": "P100", "gpus": 1},
        speed={"V100": 2.0, "P100": 1.0},
    )
    r = run([TraceJob("fast", 0, 10, 1), TraceJob("both", 100, 10, 2)], spec)
    assert segs(r) == {"fast": [(0, 5)], "both": [(100, 110)]}  # 2 types: the slower one's speed
    assert r.records[0].segments[0] == Segment(0, 5, "V100", "v:0")
    assert r.records[1].segments[0].gpu_type == "P100+V100"
    assert r.records[1].segments[0].nodes == "p:0;v:0"  # parts in node-name order


def test_allowed_types_are_respected() -> None:
    spec = cluster(
        {"name": "v", "gpu_type": "V100", "gpus": 1},
        {"name": "p", "gpu_type": "P100", "gpus": 1},
        speed={"V100": 1.0, "P100": 1.0},
    )
    r = run(
        [
            TraceJob("a", 0, 10, 1, gpu_types=("P100",)),
            TraceJob("b", 0, 10, 1, gpu_types=("P100",)),
        ],
        spec,
    )
    assert [s.nodes for rec in r.records for s in rec.segments] == ["p:0", "p:0"]
    assert segs(r)["b"] == [(10, 20)]


def test_jobs_that_can_never_run_are_rejected_with_a_reason() -> None:
    spec = cluster(
        {"name": "n", "gpu_type": "P100", "gpus": 2}, queues={"small": {"limit_gpus": 1}}
    )
    jobs = [
        TraceJob("big", 0, 1, 3),
        TraceJob("typed", 0, 1, 1, gpu_types=("TPU",)),
        TraceJob("nodur", 0, None, 1),
        TraceJob("overq", 0, 1, 2, vc="small"),
        TraceJob("ok", 0, 1, 1),
    ]
    r = run(jobs, spec)
    assert r.rejected == {
        "more GPUs than the cluster has": 1,
        "GPU type not in cluster": 1,
        "no run time in trace": 1,
        "more GPUs than its queue's limit": 1,
    }
    assert r.summary()["jobs"] == 1
    assert [rec.job_id for rec in r.records if not rec.segments] == [
        "big",
        "typed",
        "nodur",
        "overq",
    ]


def test_queue_limit_holds_jobs_back() -> None:
    spec = cluster({"name": "n", "gpu_type": "P100", "gpus": 4}, queues={"q": {"limit_gpus": 2}})
    jobs = [TraceJob(f"j{i}", 0, 10, 1, vc="q") for i in range(3)] + [TraceJob("x", 0, 10, 1)]
    assert segs(run(jobs, spec)) == {
        "j0": [(0, 10)],
        "j1": [(0, 10)],
        "j2": [(10, 20)],
        "x": [(0, 10)],
    }


def test_sharing_jobs_pack_onto_one_gpu() -> None:
    spec = cluster({"name": "n", "gpu_type": "T4", "gpus": 1}, speed={"T4": 1.0})
    jobs = [TraceJob("s1", 0, 10, 1, gpu_milli=500), TraceJob("s2", 0, 10, 1, gpu_milli=500)]
    jobs.append(TraceJob("s3", 0, 10, 1, gpu_milli=500))
    r = run(jobs, spec)
    assert segs(r) == {"s1": [(0, 10)], "s2": [(0, 10)], "s3": [(10, 20)]}
    assert r.summary()["gpu_util_makespan"] == 15 / 20


def test_las_preempts_a_demoted_job() -> None:
    # A crosses the first LAS threshold (3600 GPU-s) at t=3600; B arrives at 4000 in the top
    # queue, so A is stopped, B runs 4000-4100, A resumes with the 6000 s it has left.
    jobs = [TraceJob("A", 0, 10000, 1), TraceJob("B", 4000, 100, 1)]
    r = run(jobs, ONE_GPU, "las", preempt=True)
    assert segs(r) == {"A": [(0, 4000), (4100, 10100)], "B": [(4000, 4100)]}
    assert r.preemptions == 1
    assert r.summary()["avg_bsld"] == (10100 / 10000 + 1.0) / 2
    assert segs(run(jobs, ONE_GPU, "las")) == {"A": [(0, 10000)], "B": [(10000, 10100)]}


def test_jobs_out_round_trip_reproduces_the_summary(tmp_path: Path) -> None:
    jobs = [
        TraceJob(f"j{i}", i * 3.3, (i * 37) % 50 + 0.1, 1 + i % 3, vc=f"v{i % 2}")
        for i in range(60)
    ]
    spec = cluster({"name": "n", "count": 2, "gpu_type": "P100", "gpus": 4})
    r = run(jobs, spec, "random", seed=3)
    out = tmp_path / "jobs.csv"
    write_jobs_csv(r.records, out)
    back = read_jobs_csv(out)
    assert back == r.records
    from shared.metrics import summarize

    again = summarize(back, spec.total_gpus, r.placement_ms, r.rejected, r.discipline, 0)
    assert again == r.summary()


@pytest.mark.parametrize("policy", ["random", "sjf-est", "multifactor", "drf", "f1"])
def test_same_seed_same_bytes(tmp_path: Path, policy: str) -> None:
    jobs = [
        TraceJob(f"j{i}", i // 4, (i * 7919) % 97 + 1, 1 + i % 4, vc=f"v{i % 3}")
        for i in range(300)
    ]
    spec = cluster({"name": "n", "count": 3, "gpu_type": "P100", "gpus": 4})
    paths = []
    for k in range(2):
        write_jobs_csv(run(jobs, spec, policy, seed=7).records, tmp_path / f"{k}.csv")
        paths.append((tmp_path / f"{k}.csv").read_bytes())
    assert paths[0] == paths[1]
    if policy == "random":
        write_jobs_csv(run(jobs, spec, policy, seed=8).records, tmp_path / "other.csv")
        assert (tmp_path / "other.csv").read_bytes() != paths[0]


def test_a_job_is_stopped_at_its_time_limit(tmp_path: Path) -> None:
    # A asks for 60 s and would run 100: stopped at 60, B starts then; C runs exactly its
    # 30 s limit (its finish comes first: not stopped); D has no limit
    jobs = [
        TraceJob("A", 0, 100, 1, time_limit_s=60.0),
        TraceJob("B", 1, 10, 1, time_limit_s=600.0),
        TraceJob("C", 2, 30, 1, time_limit_s=30.0),
        TraceJob("D", 3, 5, 1),
    ]
    r = run(jobs, ONE_GPU)
    assert segs(r) == {"A": [(0, 60)], "B": [(60, 70)], "C": [(70, 100)], "D": [(100, 105)]}
    assert [rec.timed_out for rec in r.records] == [True, False, False, False]
    s = r.summary()
    assert s["timed_out"] == 1
    assert s["avg_jct_s"] == (60 + 69 + 98 + 102) / 4
    # the flag travels in the jobs file, and the summary comes back from it
    out = tmp_path / "jobs.csv"
    write_jobs_csv(r.records, out)
    assert out.read_text().splitlines()[0].endswith(",timed_out")
    back = read_jobs_csv(out)
    assert back == r.records
    from shared.metrics import summarize

    assert summarize(back, 1, r.placement_ms, r.rejected, r.discipline, 0) == s
    # without limits nothing is stopped and the key is absent
    free = run([TraceJob(j.job_id, j.submit_s, j.duration_s, 1) for j in jobs], ONE_GPU)
    assert "timed_out" not in free.summary()
    write_jobs_csv(free.records, out)
    assert "timed_out" not in out.read_text().splitlines()[0]


def test_the_time_limit_is_wall_time_on_the_gpus_it_got() -> None:
    # 50 s of work on the reference P100 takes 100 s on a half-speed K80: the 80 s limit
    # stops it at 80; on a V100 (twice the reference) it takes 25 s and ends
    spec = cluster(
        {"name": "k", "gpu_type": "K80", "gpus": 1},
        {"name": "v", "gpu_type": "V100", "gpus": 1},
        speed={"K80": 0.5, "P100": 1.0, "V100": 2.0},
    )
    jobs = [
        TraceJob("slow", 0, 50, 1, gpu_types=("K80",), time_limit_s=80.0),
        TraceJob("fast", 0, 50, 1, gpu_types=("V100",), time_limit_s=80.0),
    ]
    r = run(jobs, spec)
    assert segs(r) == {"slow": [(0, 80)], "fast": [(0, 25)]}
    assert [rec.timed_out for rec in r.records] == [True, False]


def test_the_time_limit_counts_every_segment_of_a_preempted_job() -> None:
    # as test_las_preempts_a_demoted_job: A runs 0-4000, is stopped for B, resumes at
    # 4100; its 7000 s limit leaves it 3000 s more, so it is stopped at 7100, not 10100
    jobs = [TraceJob("A", 0, 10000, 1, time_limit_s=7000.0), TraceJob("B", 4000, 100, 1)]
    r = run(jobs, ONE_GPU, "las", preempt=True)
    assert segs(r) == {"A": [(0, 4000), (4100, 7100)], "B": [(4000, 4100)]}
    assert [rec.timed_out for rec in r.records] == [True, False]
