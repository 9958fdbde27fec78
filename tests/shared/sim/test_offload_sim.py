"""Offloading jobs in the simulator: rates shared on a node, recomputed when jobs
start and finish there; `--jobs-out` carries what it takes to recompute the offload
figures; marking of traces without model sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cluster import parse_cluster
from shared.offload_metrics import offload_summary
from shared.sim import SimConfig, read_jobs_csv, simulate, write_jobs_csv
from shared.sim.offload_cost import default_calibration, step_cost
from shared.sim.offload_jobs import BYTES_PER_PARAM, MODEL_SIZES, mark_offloading
from shared.sim.offload_state import OffloadState
from shared.traces import TraceJob
from tests.shared.sim.jobs_check import recompute_offload, violations

GPT2XL = int(1.56e9 * BYTES_PER_PARAM)
CLUSTER = parse_cluster(
    {"name": "one", "reference": "V100",
     "nodes": [{"name": "n", "gpu_type": "V100", "gpus": 2, "pcie_gbps": 16, "nvme_gbps": 3}]}
)  # fmt: skip


def _slowdown(streams: int) -> float:
    """A GPT-2 XL GPU's slowdown with `streams` offloading GPUs on the node, from the
    cost model's parts (demand, calibration, step_cost), not the simulator."""
    d = OffloadState(CLUSTER).demand(GPT2XL, 1, 0)
    h = default_calibration().hidden_fraction
    return step_cost(d.traffic, d.compute_ms, h, 16 / streams, 3 / streams).slowdown


def _run(jobs: list[TraceJob]) -> dict[str, float]:
    res = simulate(jobs, CLUSTER, make_policy("fifo"), make_placer("greedy"), SimConfig())
    return {r.job_id: r.segments[-1].finish_s for r in res.records}


def test_shared_link_slows_both_and_rate_recomputed_when_one_finishes() -> None:
    f1, f2 = _slowdown(1), _slowdown(2)
    assert 1.0 < f1 < f2
    a = TraceJob("a", 0.0, 1000.0, 1, param_bytes=GPT2XL)
    b = TraceJob("b", 0.0, 3000.0, 1, param_bytes=GPT2XL)
    fin = _run([a, b])
    # both share the link until a ends at 1000 · f2; b has done 1000 s of its work by
    # then and runs its last 2000 s alone at f1
    assert fin["a"] == pytest.approx(1000.0 * f2, rel=1e-9)
    assert fin["b"] == pytest.approx(1000.0 * f2 + 2000.0 * f1, rel=1e-9)
    # a job that does not offload neither slows nor is slowed
    c = TraceJob("c", 0.0, 3000.0, 1)
    fin = _run([a, c])
    assert fin == pytest.approx({"a": 1000.0 * f1, "c": 3000.0})


def test_a_job_that_moves_nothing_shares_no_bandwidth() -> None:
    """BERT-large (0.34B, fp32 with AdamW states) fits half a 16 GiB GPU: its plan moves
    no byte, so beside it a GPT-2 XL GPU streams alone (slowdown f1 from the cost model's
    parts), it runs at 1.0, and placement sees its node as one without offloading jobs."""
    bert = int(0.34e9 * BYTES_PER_PARAM)
    st = OffloadState(CLUSTER)
    assert st.demand(bert, 1, 0).traffic.bytes_moved == 0
    assert st.demand(GPT2XL, 1, 0).traffic.bytes_moved > 0
    f1 = _slowdown(1)
    a = TraceJob("a", 0.0, 1000.0, 1, param_bytes=GPT2XL)
    c = TraceJob("c", 0.0, 3000.0, 1, param_bytes=bert)
    assert _run([a, c]) == pytest.approx({"a": 1000.0 * f1, "c": 3000.0}, rel=1e-12)
    empty = (st.signature("n"), st.estimate(GPT2XL, 1, "n", 1))
    st.add_job(0, "c", bert, 1)
    assert st.start(0, [(0, 1)]) == {0}
    assert st.streams_on("n") == 0 and not st.moves_on(bert, 1, "n")
    assert (st.signature("n"), st.estimate(GPT2XL, 1, "n", 1)) == empty
    assert st.estimate(bert, 1, "n", 1) == (1.0, 0.0)
    assert st.step(0).slowdown == 1.0
    st.add_job(1, "a", GPT2XL, 1)
    st.start(1, [(0, 1)])
    assert st.step(1).slowdown == pytest.approx(f1, rel=1e-12)
    assert st.stop(0) == set() and st.streams_on("n") == 1


def test_jobs_out_recomputes_offload_figures(tmp_path: Path) -> None:
    jobs = [TraceJob(f"j{i}", 100.0 * i, 500.0 + 50 * i, 1, param_bytes=GPT2XL if i % 2 else None)
            for i in range(12)]  # fmt: skip
    res = simulate(jobs, CLUSTER, make_policy("fifo"), make_placer("greedy"), SimConfig())
    out = tmp_path / "jobs.csv"
    write_jobs_csv(res.records, out)
    summary = res.summary()
    assert violations(out) == []
    mine = recompute_offload(out)
    assert mine["offload_jobs"] == summary["offload_jobs"] == 6
    for k in ("offload_avg_jct_s", "offload_migration_s", "offload_slowdown"):
        assert mine[k] == pytest.approx(summary[k], rel=1e-9)
    assert offload_summary(read_jobs_csv(out)) == pytest.approx(offload_summary(res.records))
    recs = res.offload
    assert set(recs) == {f"j{i}" for i in range(1, 12, 2)}
    for rec in recs.values():
        assert 0.0 <= rec.hit_rate <= 1.0 and rec.migration_ms > 0 and rec.unhidden_s > 0


def test_marking_is_seeded_stated_and_keeps_known_sizes() -> None:
    jobs = [TraceJob(f"j{i}", float(i), 10.0, 1 << (i % 6)) for i in range(3000)]
    jobs[7] = TraceJob("j7", 7.0, 10.0, 1, param_bytes=123)
    a = mark_offloading(jobs, 0.3, seed=1)
    assert a == mark_offloading(jobs, 0.3, seed=1)
    assert a != mark_offloading(jobs, 0.3, seed=2)
    marked = [j for j in a if j.param_bytes and j.job_id != "j7"]
    assert 0.27 * 3000 < len(marked) < 0.33 * 3000
    assert a[7].param_bytes == 123
    for j in marked:
        bucket = next(m for hi, m in MODEL_SIZES if j.num_gpus <= hi)
        assert j.param_bytes in {int(p * BYTES_PER_PARAM) for _, p in bucket}
    assert all(j.param_bytes is None for j in mark_offloading(jobs[:7], 0.0, seed=1))


def test_reward_part_and_pressure_feature() -> None:
    from shared.offload_signal import MISS_COEF, UNHIDDEN_COEF, offload_part, offload_pressure

    # hand values: 100 s held, 20 lost, hit 0.9; 300 s held, 30 lost, hit 0.5
    part = offload_part([(100.0, 20.0, 0.9), (300.0, 30.0, 0.5)])
    assert part.unhidden == pytest.approx(50 / 400)
    assert part.hit_rate == pytest.approx((90 + 150) / 400)
    assert part.value == pytest.approx(-UNHIDDEN_COEF * 0.125 - MISS_COEF * 0.4)
    assert offload_part([]).value == 0.0
    assert offload_pressure(0.0, 10.0) == 0.0
    assert offload_pressure(5.0, 15.0) == pytest.approx(0.25)
    assert offload_pressure(5.0, 0.0) == 1.0
    # in the simulator: the run's records give the part; a second offloading job on
    # the one node sees less free bandwidth than the first did
    a = TraceJob("a", 0.0, 1000.0, 1, param_bytes=GPT2XL)
    b = TraceJob("b", 0.0, 3000.0, 1, param_bytes=GPT2XL)
    res = simulate([a, b], CLUSTER, make_policy("fifo"), make_placer("greedy"), SimConfig())
    recs = res.offload.values()
    want = offload_part((r.run_s, r.unhidden_s, r.hit_rate) for r in recs)
    assert res.offload_part() == want and want.value < 0
    st = OffloadState(CLUSTER)
    st.add_job(0, "a", GPT2XL, 1)
    st.add_job(1, "b", GPT2XL, 1)
    before = st.pressure("b", frozenset())
    st.start(0, [(0, 1)])
    assert 0.0 < before < st.pressure("b", frozenset()) < 1.0
    assert st.free_gbps(frozenset({"K80"})) == 0.0
