"""The identity features are causal: at every decision they are a function of jobs
that had finished by then, never of a job finished later nor of any job's own run
time. Checked on real ThetaGPU jobs replayed by the simulator: run times of every job
that finishes after a time T are changed, and every window encoded before T must come
out bit for bit the same. Also: the served encoder equals the per-job reference on
jobs that carry identity, and the shipped checkpoint reads no identity feature."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from services.placement.registry import make_placer
from services.scoring.policies.fifo import Fifo
from services.scoring.rl.reference import encode_per_job
from shared.cluster import parse_cluster
from shared.policy_api import Observation, QueuedJob
from shared.policy_features import FEATURE_NEEDS, IDENTITY_FEATURES, JOB_FEATURES, encode
from shared.sim import SimConfig, simulate
from shared.traces import SkipStats, TraceJob
from shared.traces.registry import open_trace
from tests.paths import THETAGPU

# 2 DGX nodes: the first ThetaGPU jobs queue on it
CLUSTER = parse_cluster({"nodes": [{"name": "dgx", "count": 2, "gpu_type": "A100", "gpus": 8}]})
IDENT = [JOB_FEATURES.index(f) for f in IDENTITY_FEATURES]


class Recording(Fifo):
    """FIFO that encodes every window it is asked for, as a learned policy would."""

    name = "fifo-recording"
    time_invariant = False  # a round at every event: more decisions to compare

    def __init__(self) -> None:
        self.seen: list[tuple[float, tuple[str, ...], bytes]] = []

    def window(self, k: int, obs: Observation) -> Iterator[QueuedJob]:
        jobs = list(self._queue.head(128))
        x, _ = encode(jobs, obs, 128)
        self.seen.append((obs.now, tuple(j.job_id for j in jobs), x.tobytes()))
        return iter(jobs[:k])


def jobs() -> list[TraceJob]:
    return list(itertools.islice(open_trace(THETAGPU, "alcf", CLUSTER, SkipStats()), 400))


def run(trace: list[TraceJob]) -> tuple[Recording, dict[str, float]]:
    policy = Recording()
    result = simulate(trace, CLUSTER, policy, make_placer("greedy"), SimConfig(seed=0))
    finish = {r.job_id: r.segments[-1].finish_s for r in result.records if r.segments}
    return policy, finish


def test_features_before_t_ignore_every_run_time_not_yet_known() -> None:
    trace = jobs()
    a, finish = run(trace)
    t = sorted(finish.values())[len(finish) // 2]  # half the jobs have finished by T
    later = {j for j, f in finish.items() if f > t}
    changed = [
        dataclasses.replace(j, duration_s=(j.duration_s or 0.0) * 3 + 17.0)
        if j.job_id in later else j
        for j in trace
    ]  # fmt: skip
    b, _ = run(changed)
    before_a = [s for s in a.seen if s[0] < t]
    before_b = [s for s in b.seen if s[0] < t]
    assert len(before_a) > 100
    assert before_a == before_b  # same windows, same features, to the bit
    # the comparison has power: windows before T hold jobs whose own run time was
    # changed, the identity columns are not all zero, and after T the runs differ
    assert any(later.intersection(ids) for _, ids, _ in before_a)
    x = np.frombuffer(before_a[-1][2], dtype=np.float32).reshape(128, len(JOB_FEATURES))
    assert np.abs(x[:, IDENT]).sum() > 0
    assert [s for s in a.seen if s[0] >= t] != [s for s in b.seen if s[0] >= t]


def test_served_encoder_equals_the_per_job_reference_with_identity() -> None:
    trace = jobs()[:300]
    policy, _ = run(trace)
    # re-encode one late window both ways on the history the run left behind
    obs_jobs = [
        QueuedJob(i, j.job_id, j.submit_s, j.num_gpus, gpu_types=frozenset(j.gpu_types),
                  user=j.user, project=j.project, app=j.app, time_limit_s=j.time_limit_s)
        for i, j in enumerate(trace[:128])
    ]  # fmt: skip

    class Obs:
        now = trace[127].submit_s + 600.0
        history = policy.ctx.history
        gpu_types = ("A100",)

        def total_gpus(self, t: str | None = None) -> int:
            return 48

        def free_gpus(self, t: str | None = None) -> int:
            return 8

        def waiting_gpus(self, t: str | None = None) -> float:
            return 100.0

        def fragmentation(self, t: str | None = None) -> float:
            return 0.25

        def vc_gpus(self, vc: str) -> float:
            return 0.0

        def queue_length(self) -> int:
            return 128

    fast, _ = encode(obs_jobs, Obs(), 128)
    ref, _ = encode_per_job(obs_jobs, Obs(), 128)
    np.testing.assert_allclose(fast[:, IDENT], ref[:, IDENT], rtol=1e-6, atol=1e-6)
    assert np.abs(fast[:, IDENT]).sum() > 0


def test_feature_needs_name_only_identity_features() -> None:
    assert set(FEATURE_NEEDS) <= set(IDENTITY_FEATURES)


def test_sibling_history_is_bounded_and_drops_the_earliest() -> None:
    """A scoring service runs for months: each class keeps `SIBLINGS_KEPT` finished
    jobs for the sibling signal, the earliest submitted dropped first."""
    from shared.policy_api import History

    h = History()
    n = History.SIBLINGS_KEPT + 10
    for i in range(n):
        h.record(QueuedJob(i, f"j{i}", float(i) * 10, 1, user="u"), 99.0)
    assert h.siblings("u", 1, -1750.0) is None  # only the first ten were this close: gone
    count, mean = h.siblings("u", 1, 10.0 * (n - 1)) or (0, 0.0)
    assert count == 181  # submitted within 1,800 s: the last 181 (every 10 s)
    assert mean == pytest.approx(2.0)  # log10(1 + 99)
