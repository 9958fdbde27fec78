"""Re-placement of running offloading jobs (services/placement/replace.py): the
decision against hand-solved instances, and in the simulator against a hand-solved
run, the trace's work conserved and an independent reading of --jobs-out."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from random import Random

import pytest

from bench.offload_breakdown import breakdown
from services.placement.registry import make_placer
from services.placement.replace import choose_move
from services.scoring.policies import make_policy
from shared.cluster import parse_cluster
from shared.placement_api import Allocation, JobRequest, NodeFree
from shared.sched.replacement import Move, ReplaceConfig, RunningOffload, restart_cost_s
from shared.sim import SimConfig, simulate, write_jobs_csv
from shared.sim.offload_cost import default_calibration, step_cost
from shared.sim.offload_jobs import BYTES_PER_PARAM
from shared.sim.offload_state import OffloadState
from shared.speeds import speed_of
from shared.traces import TraceJob
from tests.shared.sim.jobs_check import recompute_offload, violations

GPT2XL = int(1.56e9 * BYTES_PER_PARAM)
H = 3600.0


# ---- the decision alone, with hand-made estimates -----------------------------------
def _running(elapsed: float, slowdown: float, relief: float = 0.0) -> RunningOffload:
    job = JobRequest("j", 1, 1000, frozenset(), 1.0, 1.0, 0.0)
    return RunningOffload(job, 10**9, elapsed, H, slowdown, 1.0, relief, frozenset({"old"}))


NODES = [NodeFree("old", "V100", (1000,)), NodeFree("a", "V100", (1000,)),
         NodeFree("b", "V100", (0, 1000))]  # fmt: skip
OWN = {"old": 1.0, "a": 1.5, "b": 1.2}  # own slowdown a job would get on each node
CAUSED = {"old": 0.0, "a": 0.0, "b": 0.1}  # and the slowdown it would add there


def _decide(r: RunningOffload, cfg: ReplaceConfig) -> tuple[Move | None, list[list[str]]]:
    asked: list[list[str]] = []

    def estimate(pbytes: int, gpus: int, node_id: str, take: int) -> tuple[float, float]:
        return OWN[node_id], CAUSED[node_id]

    def place(job: JobRequest, nodes: Sequence[NodeFree]) -> Allocation | None:
        asked.append([n.node_id for n in nodes])
        n = nodes[0]
        g = next(i for i, f in enumerate(n.free_milli) if f == 1000)
        return Allocation(job.job_id, ((n.node_id, (g,)),), 1000)

    move = choose_move([r], NODES, {"V100": 1.0}, cfg, estimate, place, lambda n: n.node_id)
    return move, asked


def test_a_job_moves_where_it_saves_most_and_never_to_its_own_node() -> None:
    cfg = ReplaceConfig()
    cost = restart_cost_s(10**9, cfg)
    assert cost == pytest.approx(300.0 + 2 * 3 * 1e9 / 1.25e9)  # 304.8 s
    r = _running(elapsed=10 * H, slowdown=2.0, relief=0.2)
    move, asked = _decide(r, cfg)
    # before 2.0; a: after 1.5 − 0.2 = 1.3; b: 1.2 + 0.1 − 0.2 = 1.1 (saves most)
    assert asked == [["b"]]  # the placer is asked for b's class only
    assert move is not None and move.alloc.gpus == (("b", (1,)),)
    assert move.after == pytest.approx(1.1)
    assert move.saved_s == pytest.approx((2.0 - 1.1) * 10 * H / 2.0)
    assert move.cost_s == pytest.approx(cost)


@pytest.mark.parametrize(
    ("elapsed", "slowdown", "cfg", "why"),
    [
        (6 * H - 1, 2.0, ReplaceConfig(), "has not run min_run_s"),
        (7 * H, 2.0, ReplaceConfig(after=8.0), "has not run `after` times its estimate"),
        (10 * H, 1.3, ReplaceConfig(min_gain=0.1), "b's own 1.2 is not 10% below 1.3"),
        (10 * H, 2.0, ReplaceConfig(payback=1e4), "the saving does not pay back the cost"),
    ],
)
def test_no_move(elapsed: float, slowdown: float, cfg: ReplaceConfig, why: str) -> None:
    move, asked = _decide(_running(elapsed, slowdown), cfg)
    assert move is None and asked == [], why


def test_a_moved_job_settles_and_idle_only_waits_for_an_empty_queue() -> None:
    r = _running(elapsed=10 * H, slowdown=2.0)
    moved = RunningOffload(**{**r.__dict__, "moved_s": 5 * H})
    assert _decide(moved, ReplaceConfig(settle_s=5 * H))[0] is not None
    assert _decide(moved, ReplaceConfig(settle_s=5 * H + 1))[0] is None
    assert _decide(r, ReplaceConfig(settle_s=1e9))[0] is not None  # never moved
    cfg = ReplaceConfig(idle_only=True)
    nodes = {"V100": 1.0}
    est = lambda *a: (1.0, 0.0)  # noqa: E731
    place = lambda job, ns: Allocation(job.job_id, ((ns[0].node_id, (0,)),), 1000)  # noqa: E731
    assert choose_move([r], NODES, nodes, cfg, est, place, lambda n: n.node_id, waiting=1) is None
    assert choose_move([r], NODES, nodes, cfg, est, place, lambda n: n.node_id, waiting=0)


def test_payback_boundary() -> None:
    """saved = (before − after) · elapsed / before against payback · cost, at the edge."""
    r = _running(elapsed=10 * H, slowdown=2.0)
    saved = (2.0 - 1.3) * 10 * H / 2.0  # b: after 1.2 + 0.1
    cost = restart_cost_s(10**9, ReplaceConfig())
    assert _decide(r, ReplaceConfig(payback=saved / cost * 0.999))[0] is not None
    assert _decide(r, ReplaceConfig(payback=saved / cost * 1.001))[0] is None


# ---- in the simulator -----------------------------------------------------------------
CLUSTER = parse_cluster(
    {"name": "two", "reference": "V100",
     "nodes": [{"name": "a", "gpu_type": "V100", "gpus": 2, "pcie_gbps": 16, "nvme_gbps": 3},
               {"name": "b", "gpu_type": "V100", "gpus": 2, "pcie_gbps": 16, "nvme_gbps": 3}]}
)  # fmt: skip


def _slowdown(streams: int) -> float:
    """A GPT-2 XL GPU's slowdown with `streams` offloading GPUs on its node, from the
    cost model's parts, not the simulator."""
    d = OffloadState(CLUSTER).demand(GPT2XL, 1, 0)
    h = default_calibration().hidden_fraction
    return step_cost(d.traffic, d.compute_ms, h, 16 / streams, 3 / streams).slowdown


def test_a_long_job_moves_when_a_node_frees_and_pays_its_restart(tmp_path: Path) -> None:
    """z (2 GPUs, no offload) holds one node for 8 h; x and y (GPT-2 XL, 20 h of work
    each, estimate 1 h) share the other's link from t = 1 at f2 each. When z's node
    frees at 8 h, x (first by id among equals) moves there: it restores for `cost`
    seconds, then both run alone at f1. Finish times by hand."""
    f1, f2 = _slowdown(1), _slowdown(2)
    cfg = ReplaceConfig(min_gain=0.1)
    assert f1 < 0.9 * f2
    cost = restart_cost_s(GPT2XL, cfg)
    t, w = 8 * H, 20 * H
    jobs = [TraceJob("z", 0.0, t, 2), TraceJob("x", 1.0, w, 1, param_bytes=GPT2XL),
            TraceJob("y", 1.0, w, 1, param_bytes=GPT2XL)]  # fmt: skip
    runs = {}
    for name in ("greedy+offload+replace", "milp+offload+replace", "greedy+offload"):
        placer = make_placer(name, reproducible=True, replace=cfg)
        res = simulate(jobs, CLUSTER, make_policy("fifo"), placer, SimConfig())
        runs[name] = res
        assert name.startswith("greedy") or getattr(placer, "cycles", 0) > 0  # GC counts them
        rec = {r.job_id: r for r in res.records}
        zn = rec["z"].segments[0].nodes.split(":")[0]
        other = ({"a", "b"} - {zn}).pop()
        left = w - (t - 1.0) / f2  # work left at 8 h
        if name.endswith("+replace"):
            assert res.replacements == 1
            x, y = rec["x"].segments, rec["y"].segments
            assert [s.nodes.split(":")[0] for s in x] == [other, zn]
            assert x[0].finish_s == x[1].start_s == t and x[1].restart_s == pytest.approx(cost)
            assert x[1].finish_s == pytest.approx(t + cost + left * f1, rel=1e-9)
            assert x[1].offload_s == pytest.approx(left * (f1 - 1.0), rel=1e-9)
            assert len(y) == 1 and y[0].finish_s == pytest.approx(t + left * f1, rel=1e-9)
        else:
            assert res.replacements == 0
            assert rec["x"].segments[-1].finish_s == pytest.approx(1.0 + w * f2, rel=1e-9)
    out = tmp_path / "jobs.csv"
    res = runs["greedy+offload+replace"]
    write_jobs_csv(res.records, out)
    assert violations(out) == []
    mine, summary = recompute_offload(out), res.summary()
    assert mine["offload_moves"] == summary["offload_moves"] == 1
    for k in ("offload_avg_jct_s", "offload_migration_s", "offload_restart_s", "offload_slowdown"):
        assert mine[k] == pytest.approx(summary[k], rel=1e-9)
    assert summary["offload_restart_s"] == pytest.approx(cost / 2)
    # bench.offload_breakdown splits each segment: x's first had y there from its
    # start (all at start); its second, after the restore, runs alone
    with out.open(newline="") as fh:
        parts = breakdown(CLUSTER, list(csv.DictReader(fh))).jobs
    xs = [p for p in parts if p.job_id == "x"]
    assert len(xs) == 2 and all(p.total == pytest.approx(p.offload_s, rel=1e-9) for p in xs)
    assert xs[1].alone == pytest.approx(left * (f1 - 1.0), rel=1e-9)
    assert xs[1].at_start == pytest.approx(0.0, abs=1e-6) and xs[1].later == 0.0


def test_moves_conserve_every_jobs_work_and_never_share_a_gpu(tmp_path: Path) -> None:
    """Random jobs on a mixed cluster with re-placement made eager (every running
    offloading job a candidate at once, any gain): the CSV shows no GPU held twice,
    and each job's progress over its segments, (held − restore − unhidden) × speed
    of its type / the reference's, adds up to its trace duration."""
    cluster = parse_cluster(
        {"name": "mix", "reference": "V100",
         "nodes": [{"name": f"n{i}", "gpu_type": t, "gpus": g, "pcie_gbps": p, "nvme_gbps": 3}
                   for i, (t, g, p) in enumerate([("V100", 4, 16), ("V100", 2, 32),
                                                  ("P100", 2, 16), ("P100", 1, 12)])]}
    )  # fmt: skip
    rng = Random(7)
    sizes = [GPT2XL, int(2.85e9 * BYTES_PER_PARAM), None]
    jobs = [TraceJob(f"j{i}", rng.uniform(0, 40 * H), rng.uniform(0.2, 30) * H,
                     rng.choice([1, 1, 1, 2]), param_bytes=rng.choice(sizes))
            for i in range(60)]  # fmt: skip
    eager = ReplaceConfig(after=0.0, min_run_s=0.0, min_gain=0.0, payback=0.0)
    placer = make_placer("greedy+offload+replace", reproducible=True, replace=eager)
    res = simulate(jobs, cluster, make_policy("fifo"), placer, SimConfig())
    assert res.replacements > 0
    out = tmp_path / "jobs.csv"
    write_jobs_csv(res.records, out)
    assert violations(out) == []
    speed = {
        t: speed_of(t, cluster.speed) / speed_of("V100", cluster.speed) for t in ("V100", "P100")
    }
    assert speed["P100"] < 1.0
    by_id = {j.job_id: j for j in jobs}
    for r in res.records:
        done = sum(
            (s.finish_s - s.start_s - s.offload_s - s.restart_s)
            * min(speed[t] for t in s.gpu_type.split("+"))
            for s in r.segments
        )
        assert done == pytest.approx(by_id[r.job_id].duration_s, rel=1e-6), r.job_id
