"""The observation encoder on a hand-set cluster state."""

from __future__ import annotations

import math

import numpy as np

from shared.cluster import parse_cluster
from shared.placement_api import Allocation
from shared.policy_api import History, QueuedJob
from shared.policy_features import JOB_FEATURES, cluster_features, encode
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.state import ClusterState


def test_encode_by_hand() -> None:
    spec = parse_cluster(
        {"nodes": [{"name": "p", "count": 2, "gpu_type": "P100", "gpus": 4},
                   {"name": "v", "gpu_type": "V100", "gpus": 8}]}
    )  # fmt: skip
    state = ClusterState(spec)
    assert state.claim(Allocation("r", (("p-0", (0, 1)),)), 2) is not None  # 2 P100 busy
    waiting, history = WaitingIndex(), History()
    a = QueuedJob(0, "a", 100.0, 4, gpu_types=frozenset({"P100"}), vc="x")
    b = QueuedJob(1, "b", 50.0, 1, gpu_milli=500, vc="y", attained_gpu_s=99.0)
    for j in (a, b):
        waiting.add(j)
    history.record(QueuedJob(9, "old", 0.0, 4, vc="x"), 999.0)
    obs = SimObservation(state, waiting, history, {})
    obs.now = 1099.0
    x, mask = encode([a, b], obs, max_jobs=3)
    assert x.shape == (3, len(JOB_FEATURES)) and mask.tolist() == [True, True, False]
    f = dict(zip(JOB_FEATURES, x[0].tolist(), strict=True))
    assert f["log2_gpus"] == 2.0 and f["share"] == 1.0 and f["types_allowed"] == 0.5
    assert math.isclose(f["log_wait_s"], 3.0, rel_tol=1e-6)  # log10(1 + 999)
    assert (
        math.isclose(f["log_mean_run_group_s"], 3.0, rel_tol=1e-6) and f["has_group_history"] == 1
    )
    assert f["fits_now"] == 1.0  # 6 P100 free
    assert math.isclose(f["demand_over_free"], (4 + 0.5) / 6, rel_tol=1e-6)  # a (P100) + b (any)
    assert math.isclose(f["free_over_total"], 6 / 8, rel_tol=1e-6)
    assert math.isclose(f["fragmentation"], 2 / 6, rel_tol=1e-6)  # 2 of 6 free P100 on a used node
    assert f["vc_share"] == 0.0 and f["vc_share_rank"] == 0.0  # no VC holds a GPU
    assert f["est_rank"] == 1.0 and math.isclose(f["log_group_runs"], math.log10(2), rel_tol=1e-6)
    assert math.isclose(f["group_log_run"], 3.0, rel_tol=1e-6) and f["group_short_share"] == 0.0
    assert math.isclose(f["log_last_run_s"], 3.0, rel_tol=1e-6)
    g = dict(zip(JOB_FEATURES, x[1].tolist(), strict=True))
    assert g["est_rank"] == 0.0 and g["log_group_runs"] == 0.0  # no history: sjf-est's first
    assert g["share"] == 0.5 and g["types_allowed"] == 1.0 and g["has_group_history"] == 0
    assert math.isclose(g["log_attained_gpu_s"], 2.0, rel_tol=1e-6)
    assert not np.any(x[2])
    c = cluster_features(obs)
    np.testing.assert_allclose(c, [6 / 8, 4.5 / 8, 2 / 6, 1.0, 0.5 / 8, 0.0, 2 / 1000], rtol=1e-6)


def test_offload_pressure_column() -> None:
    """`offload_pressure`: d / (d + free) from the simulator's OffloadState for an
    offloading job, computed here from its parts (demand_gbps, free_gbps) and the
    definition; 0 for a job that does not offload and on an observation without it."""
    from shared.sim.offload_jobs import BYTES_PER_PARAM
    from shared.sim.offload_state import OffloadState

    spec = parse_cluster(
        {"nodes": [{"name": "v", "count": 2, "gpu_type": "V100", "gpus": 4, "pcie_gbps": 16}]}
    )
    state = ClusterState(spec)
    waiting, history = WaitingIndex(), History()
    a = QueuedJob(0, "a", 0.0, 1)
    b = QueuedJob(1, "b", 0.0, 2)
    obs = SimObservation(state, waiting, history, {})
    col = JOB_FEATURES.index("offload_pressure")
    x, _ = encode([a, b], obs, max_jobs=2)
    assert x[0, col] == 0.0 and x[1, col] == 0.0  # no offload state: 0
    off = OffloadState(spec)
    off.add_job(0, "a", int(2.85e9 * BYTES_PER_PARAM), 1)  # T5-3B on one GPU
    off.add_job(2, "r", int(2.85e9 * BYTES_PER_PARAM), 1)
    obs.offload = off
    d = off.demand_gbps("a")
    assert d > 0
    x, _ = encode([a, b], obs, max_jobs=2)
    assert math.isclose(x[0, col], d / (d + 2 * 16.0), rel_tol=1e-6)  # nothing streams yet
    assert x[1, col] == 0.0  # b does not offload
    off.start(2, [(0, 1)])  # another offloading job streams on v-0: less free bandwidth
    free = off.free_gbps(frozenset())
    assert free < 2 * 16.0
    x, _ = encode([a, b], obs, max_jobs=2)
    assert math.isclose(x[0, col], d / (d + free), rel_tol=1e-6)


def test_vc_share_and_group_history() -> None:
    """What drf reads (GPUs held per VC) and what a group's history holds beyond its mean."""
    spec = parse_cluster({"nodes": [{"name": "p", "count": 2, "gpu_type": "P100", "gpus": 8}]})
    history = History()
    for run in (100.0, 10_000.0, 1000.0):  # x, 1 GPU: 1 of 3 runs under 600 s, last 1000 s
        history.record(QueuedJob(9, "old", 0.0, 1, vc="x"), run)
    jobs = [QueuedJob(0, "a", 0.0, 1, vc="x"), QueuedJob(1, "b", 0.0, 2, vc="y"),
            QueuedJob(2, "c", 0.0, 1, vc="z")]  # fmt: skip
    waiting = WaitingIndex()
    for j in jobs:
        waiting.add(j)
    obs = SimObservation(ClusterState(spec), waiting, history, {"x": 8.0, "y": 2.0})
    obs.now = 10.0
    x, _ = encode(jobs, obs, max_jobs=3)
    col = {name: x[:, i].tolist() for i, name in enumerate(JOB_FEATURES)}
    assert col["vc_share"] == [0.5, 2 / 16, 0.0]
    assert col["vc_share_rank"] == [1.0, 0.5, 0.0]  # z holds least, then y, then x
    assert col["est_rank"] == [1.0, 0.0, 0.0]  # y and z have no history: tied first
    assert np.allclose(col["log_group_runs"], [math.log10(4), 0.0, 0.0])
    logs = [math.log10(101.0), math.log10(10_001.0), math.log10(1001.0)]
    assert np.allclose(col["group_log_run"], [sum(logs) / 3, 0.0, 0.0])
    assert np.allclose(col["group_short_share"], [1 / 3, 0.0, 0.0])
    assert np.allclose(col["log_last_run_s"], [math.log10(1001.0), 0.0, 0.0])
