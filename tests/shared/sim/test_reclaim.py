"""Reclaim in the simulator (shared/sim/reclaim.py): schedules worked out by hand,
the per-job CSV, and random traces checked from the CSV alone against the queue
limits and the guarantee bound (grace + minimum run + a re-check)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.placement.greedy import GreedyPlacer
from services.scoring.policies import make_policy
from shared.cluster import ClusterSpec, parse_cluster
from shared.sim import SimConfig, SimResult, simulate, write_jobs_csv
from shared.sim.reclaim import RECHECK_S
from shared.traces import TraceJob

CHECKER = Path(__file__).resolve().parents[3] / ".." / "shared" / "tools" / "check_jobs.py"


def _cluster(queues: dict[str, Any], gpus: int = 8, **extra: Any) -> ClusterSpec:
    nodes = [{"name": "n", "gpu_type": "P100", "gpus": gpus}]
    return parse_cluster({"nodes": nodes, "reference": "P100", "queues": queues, **extra})


def _run(jobs: list[TraceJob], spec: ClusterSpec, policy: str = "fifo", **cfg: Any) -> SimResult:
    return simulate(jobs, spec, make_policy(policy), GreedyPlacer(), SimConfig(**cfg))


def _segs(result: SimResult) -> dict[str, list[tuple[float, float, float]]]:
    return {
        r.job_id: [(s.start_s, s.finish_s, s.lost_s) for s in r.segments] for r in result.records
    }


TWO = {"A": {"guaranteed_gpus": 4}, "B": {"guaranteed_gpus": 4}}
# B borrows A's idle half at 0 for 10000 s; A's 4-GPU job (1000 s) comes at 100
JOBS = [TraceJob("b1", 0, 10000, 8, vc="B"), TraceJob("a1", 100, 1000, 4, vc="A")]


def test_reclaim_by_hand() -> None:
    r = _run(JOBS, _cluster(TWO))
    # b1 is inside its minimum run time (600 s) until 600; the reclaim is decided
    # then, b1 stops after the 120 s grace, at 720, and a1 starts on its GPUs. b1 had
    # no checkpoint yet (every 1800 s): its 720 s are lost, all 10000 s remain; it
    # needs all 8 GPUs, so it waits for a1 (1720) and runs again to 11720.
    assert _segs(r) == {"b1": [(0, 720, 720), (1720, 11720, 0)], "a1": [(720, 1720, 0)]}
    s = r.summary()
    assert s["preemptions"] == 1
    assert s["restart_lost_gpu_h"] == 8 * 720 / 3600


def test_checkpoint_interval_sets_the_work_lost() -> None:
    r = _run(JOBS, _cluster(TWO), checkpoint_s=300.0)
    # checkpoints at 300 and 600: 600 s kept, 120 s lost, 9400 s left after 1720
    assert _segs(r)["b1"] == [(0, 720, 120), (1720, 11120, 0)]
    # a class's own interval wins over the config's
    spec = _cluster(TWO, priority_classes={"t": {"priority": 0, "checkpoint_s": 700}})
    jobs = [TraceJob("b1", 0, 10000, 8, vc="B", priority_class="t"), JOBS[1]]
    assert _segs(_run(jobs, spec, checkpoint_s=300.0))["b1"] == [(0, 720, 20), (1720, 11020, 0)]


def test_grace_and_minimum_run_are_settings() -> None:
    r = _run(JOBS, _cluster(TWO), grace_s=0.0, min_run_s=0.0)
    # decided at a1's arrival (100), stopped at once
    assert _segs(r) == {"b1": [(0, 100, 100), (1100, 11100, 0)], "a1": [(100, 1100, 0)]}


def test_never_a_non_preemptible_job_and_off_when_asked() -> None:
    classes = {"serve": {"priority": 100, "preemptible": False}}
    spec = _cluster(
        {"A": {"guaranteed_gpus": 4}, "B": {"guaranteed_gpus": 8}}, 12, priority_classes=classes
    )
    jobs = [TraceJob("b1", 0, 10000, 8, vc="B", priority_class="serve"),
            TraceJob("b2", 1, 10000, 4, vc="B"), TraceJob("a1", 100, 1000, 4, vc="A")]  # fmt: skip
    # b1 is inside B's guarantee and may not be preempted anyway; b2 borrows A's 4
    assert _segs(_run(jobs, spec))["b1"] == [(0, 10000, 0)]
    assert _segs(_run(jobs, spec))["a1"] == [(721, 1721, 0)]  # b2 started at 1: 601 + 120
    # a non-preemptible job may not borrow: b3 (serve) would take B past its 8
    jobs2 = [TraceJob("b1", 0, 10000, 8, vc="B"), TraceJob("b3", 1, 100, 4, vc="B",
             priority_class="serve")]  # fmt: skip
    assert _segs(_run(jobs2, spec))["b3"] == [(10000, 10100, 0)]
    # reclaim off: a guarantee is a word again (a1 waits for b1)
    assert _segs(_run(JOBS, _cluster(TWO), reclaim=False))["a1"] == [(10000, 11000, 0)]
    # an unknown class is rejected at arrival
    bad = [TraceJob("x", 0, 10, 1, vc="A", priority_class="nope")]
    assert _run(bad, spec).rejected == {"unknown priority class": 1}


def test_jobs_csv_has_the_lost_seconds_and_passes_the_checker(tmp_path: Path) -> None:
    r = _run(JOBS, _cluster(TWO))
    out, summ = tmp_path / "jobs.csv", tmp_path / "summary.json"
    write_jobs_csv(r.records, out)
    summ.write_text(json.dumps(r.summary()))
    rows = list(csv.DictReader(out.open()))
    assert [(x["job_id"], float(x["start_s"]), float(x["lost_s"])) for x in rows] == [
        ("b1", 0, 720), ("b1", 1720, 0), ("a1", 720, 0)
    ]  # fmt: skip
    # the summary's loss, recomputed from the file
    lost = sum(int(x["num_gpus"]) * float(x["lost_s"]) for x in rows) / 3600
    assert lost == r.summary()["restart_lost_gpu_h"]
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(out), str(summ)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout


def test_org_limit_holds_over_its_teams() -> None:
    queues = {"org": {"limit_gpus": 6}, "t1": {"parent": "org"}, "t2": {"parent": "org"}}
    jobs = [TraceJob("x", 0, 100, 4, vc="t1"), TraceJob("y", 1, 100, 4, vc="t2")]
    # 4 + 4 > 6: y waits for x although 4 GPUs are free
    assert _segs(_run(jobs, _cluster(queues)))["y"] == [(100, 200, 0)]


# ---- random traces, checked from the per-job rows alone -----------------------------
GRACE, MIN_RUN = 120.0, 600.0
BOUND = GRACE + MIN_RUN + RECHECK_S


@st.composite
def _cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[TraceJob]]:
    cap = 16
    queues: dict[str, Any] = {}
    leaves: list[str] = []
    left = cap
    for o in range(draw(st.integers(1, 2))):
        g = draw(st.integers(0, left))
        left -= g
        lim = draw(st.one_of(st.none(), st.integers(max(g, 8), cap)))
        queues[f"o{o}"] = {"guaranteed_gpus": g} | ({"limit_gpus": lim} if lim else {})
        tl = g
        for k in range(draw(st.integers(0, 2))):
            tg = draw(st.integers(0, tl))
            tl -= tg
            queues[f"o{o}t{k}"] = {"parent": f"o{o}", "guaranteed_gpus": tg}
            leaves.append(f"o{o}t{k}")
        if not any(q.get("parent") == f"o{o}" for q in queues.values()):
            leaves.append(f"o{o}")
    jobs = []
    t = 0.0
    for i in range(draw(st.integers(1, 14))):
        t += draw(st.sampled_from([0, 30, 200, 700, 2000]))
        n = draw(st.sampled_from([1, 2, 4, 8]))
        dur = draw(st.sampled_from([50, 500, 3000, 9000]))
        jobs.append(TraceJob(f"j{i}", t, float(dur), n, vc=draw(st.sampled_from(leaves))))
    return queues, jobs


def _usage_at(rows: list[tuple[str, float, float, float]], t: float) -> float:
    return sum(g for _, s, f, g in rows if s <= t < f)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_random_traces_keep_limits_and_the_guarantee_bound(case: Any) -> None:
    queues, jobs = case
    spec = parse_cluster(
        {"nodes": [{"name": "n", "gpu_type": "P100", "gpus": 8, "count": 2}], "queues": queues}
    )
    r = _run(jobs, spec, grace_s=GRACE, min_run_s=MIN_RUN)
    # the rows of the per-job file: (queue, start, finish, GPUs)
    rows: dict[str, list[tuple[str, float, float, float]]] = defaultdict(list)
    parent = {n: q.get("parent") for n, q in queues.items()}
    for rec in r.records:
        for s in rec.segments:
            for name in (rec.vc, parent.get(rec.vc)):
                if name:
                    rows[name].append((rec.job_id, s.start_s, s.finish_s, rec.num_gpus))
    # no team, no org ever above its limit (peaks are at segment starts)
    for name, q in queues.items():
        if q.get("limit_gpus") is None:
            continue
        for _, at, _, _ in rows[name]:
            assert _usage_at(rows[name], at) <= q["limit_gpus"]
    # a job that fits inside its team's unused guarantee all along starts in time
    for rec in r.records:
        g = queues[rec.vc]["guaranteed_gpus"]
        t0 = rec.submit_s
        start = rec.segments[0].start_s
        if start <= t0 + BOUND:
            continue
        others = [x for x in rows[rec.vc] if x[0] != rec.job_id]
        moments = [t0] + [s for _, s, _, _ in others if t0 < s <= t0 + BOUND]
        if all(_usage_at(others, m) + rec.num_gpus <= g for m in moments):
            raise AssertionError(f"{rec.job_id} fitted its guarantee but waited {start - t0}")
