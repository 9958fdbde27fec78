"""The RL reward's offload part in training episodes (services/scoring/rl/env.py):
off by default; with weight W the reward moves by exactly W x (policy's part -
baseline's part), and the baseline's part is that of an independent baseline run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.scoring.rl.env import EpisodeConfig, EpisodeSpec, build_episode, run_episode
from services.scoring.rl.network import NetConfig, ScoreNet
from shared.cluster import parse_cluster
from shared.offload_signal import offload_part
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES
from shared.sim import SimConfig, simulate
from shared.sim.offload_jobs import BYTES_PER_PARAM
from shared.traces import TraceJob

CLUSTER = parse_cluster(
    {"name": "c", "reference": "V100",
     "nodes": [{"name": "n", "count": 2, "gpu_type": "V100", "gpus": 4, "pcie_gbps": 8}]}
)  # fmt: skip


def _trace() -> list[TraceJob]:
    rng = np.random.default_rng(3)
    out, t = [], 0.0
    for i in range(160):
        t += float(rng.exponential(40.0))
        big = int(2.85e9 * BYTES_PER_PARAM) if i % 3 == 0 else None  # T5-3B, a third
        gpus = int(rng.choice([1, 1, 2]))
        run = float(rng.lognormal(6.0, 1.0))
        out.append(TraceJob(f"j{i}", t, run, gpus, user=f"u{i % 4}", param_bytes=big))
    return out


def test_offload_reward_adds_its_weighted_part() -> None:
    torch.manual_seed(0)
    net = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES), 8, True))
    trace, spec = _trace(), EpisodeSpec(0, 0, 3.0, 7)
    off = EpisodeConfig(prefix=8, jobs=24, load_lo=3.0, load_hi=3.0)
    on = EpisodeConfig(prefix=8, jobs=24, load_lo=3.0, load_hi=3.0, offload_reward=2.0)
    r0 = run_episode(trace, [CLUSTER], spec, off, net, JOB_FEATURES, sample=False)
    r2 = run_episode(trace, [CLUSTER], spec, on, net, JOB_FEATURES, sample=False)
    assert r0.extra == {} and r0.policy_obj == r2.policy_obj
    pp, pb = r2.extra["offload_part"], r2.extra["offload_part_baseline"]
    assert r2.reward == pytest.approx(r0.reward + 2.0 * (pp - pb), abs=1e-12)
    # the baseline's part, from a run of our own: the jobs still to schedule at the switch
    jobs, n_prefix = build_episode(trace, CLUSTER, spec, on)
    at = jobs[n_prefix].submit_s
    base = simulate(jobs, CLUSTER, make_policy(on.baseline), make_placer(on.placer),
                    SimConfig(window=on.window, seed=spec.seed))  # fmt: skip
    todo = {r.job_id for r in base.records if not r.segments or r.segments[0].start_s >= at}
    recs = [r for k, r in base.offload.items() if k in todo]
    assert recs and any(r.unhidden_s > 0 for r in recs)
    assert pb == offload_part((r.run_s, r.unhidden_s, r.hit_rate) for r in recs).value < 0
