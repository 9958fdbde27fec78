"""Validation episodes that can rank checkpoints (services/scoring/rl/validation.py).

The episodes the trainer chose its checkpoint on once ran every world at one load,
repeated one ThetaGPU window twice (a part too short for its start to move) and
kept two Philly episodes where every policy scored the same. Here: each world's
episodes take disjoint job windows, their loads are recomputed in a few lines from
the jobs' own fields, and a world where no job can ever wait gives no episode
(every candidate dropped and counted), all on the real simulator and heuristics."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from services.scoring.rl.args import HEURISTICS
from services.scoring.rl.env import EpisodeConfig, EpisodeSpec, build_episode
from services.scoring.rl.network import NetConfig, ScoreNet
from services.scoring.rl.rollout import Rollouts
from services.scoring.rl.validation import MAX_DRAWS, slot_loads, validation_set
from shared.cluster import load_cluster
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES
from shared.sim import load_jobs
from shared.traces import SkipStats

CFG = EpisodeConfig(prefix=8, jobs=16, load_lo=0.6, load_hi=1.2, baseline="f1")


def _trace(tmp: Path, name: str, n: int, gpus: list[int], mean_s: float, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    lines, t = [], 0.0
    for i in range(n):
        t += float(rng.exponential(60.0))
        lines.append(json.dumps({
            "job_id": f"{name}{i}", "submit_time": t, "num_gpus": int(rng.choice(gpus)),
            "user": f"u{i % 5}", "duration_s": float(rng.lognormal(np.log(mean_s), 1.0)),
        }))  # fmt: skip
    path = tmp / f"{name}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cluster(tmp: Path, name: str, nodes: int) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"nodes:\n  - {{name: n, count: {nodes}, gpu_type: P100, gpus: 4}}\n")
    return path


def _worlds(tmp: Path) -> tuple[list, list]:
    """World 0: busy (jobs of 1-8 GPUs for minutes on 8 GPUs, about its capacity) and long enough
    for three disjoint windows; world 1: 1-GPU jobs of a minute on 4,000 GPUs, fewer
    jobs than GPUs, so no job can ever wait, whatever the order or the load."""
    c0, c1 = load_cluster(_cluster(tmp, "busy", 2)), load_cluster(_cluster(tmp, "idle", 1000))
    busy = load_jobs(_trace(tmp, "b", 200, [1, 2, 4, 8], 60.0, 0), "jsonl", c0, SkipStats())
    idle = load_jobs(_trace(tmp, "i", 200, [1], 60.0, 1), "jsonl", c1, SkipStats())
    return [busy, idle], [c0, c1]


def _load(jobs: list, gpus: int) -> float:
    """GPU-seconds held within the submission span (each job as if it started at
    submission, cut at the last submission) per second of it, over the GPUs."""
    first, last = jobs[0].submit_s, jobs[-1].submit_s
    held = sum(j.num_gpus * min(j.duration_s or 0.0, last - j.submit_s) for j in jobs)
    return held / (last - first) / gpus


def _objs(traces: list, clusters: list) -> Callable[[list[EpisodeSpec], str], list[float]]:
    val = Rollouts(lambda: (traces, clusters), 0)
    net = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES)))

    def run(specs: list[EpisodeSpec], h: str) -> list[float]:
        cfg = EpisodeConfig(**{**asdict(CFG), "baseline": h})
        return [r.baseline_obj for r in val.run(specs, cfg, net, JOB_FEATURES)]

    return run


def test_slot_loads_by_hand() -> None:
    # the first episode of each world at its recorded load; the two others over [0.6, 1.2]
    assert slot_loads([2, 2, 1], 0.6, 1.2, [0.4, 0.5, 0.3]) == [[0.4, 0.6], [0.5, 1.2], [0.3]]
    got = slot_loads([3, 2], 0.6, 1.2, [0.4, 2.0])
    assert got[0][0] == 0.4 and got[1][0] == 2.0
    assert sorted(got[0][1:] + got[1][1:]) == pytest.approx([0.6, 0.9, 1.2])


def test_windows_loads_and_no_queue_episodes(tmp_path: Path) -> None:
    traces, clusters = _worlds(tmp_path)
    vs = validation_set(traces, clusters, CFG, 6, [7, 0], _objs(traces, clusters), HEURISTICS)
    # world 1 never queues: its three slots dropped at every draw and left empty
    assert [s.cluster for s in vs.specs] == [0, 0, 0]
    assert vs.dropped == 3 * MAX_DRAWS
    assert sorted(vs.given_up) == [(1, 0), (1, 1), (1, 2)]
    # world 0's three windows of prefix + jobs jobs do not share a job (200 jobs, 3 strata)
    want = CFG.prefix + CFG.jobs
    windows = [set(range(s.start, s.start + want)) for s in vs.specs]
    assert all(not (a & b) for i, a in enumerate(windows) for b in windows[i + 1 :])
    built = [build_episode(traces[0], clusters[0], s, CFG)[0] for s in vs.specs]
    ids = [{j.job_id for j in jobs} for jobs in built]
    assert all(not (a & b) for i, a in enumerate(ids) for b in ids[i + 1 :])
    # loads: the recorded one (the whole part's, in a few lines), then the four others
    # of both worlds at 0.6, 0.8, 1.0, 1.2 taken in turn (world 0: the 1st and 3rd)
    assert vs.specs[0].load == pytest.approx(_load(traces[0], 8))
    assert [s.load for s in vs.specs[1:]] == pytest.approx([0.6, 1.0])
    for jobs, spec, measured in zip(built, vs.specs, vs.loads, strict=True):
        # as built (thinning 24 of 96 jobs lands near the load asked for, not on it)
        assert measured == pytest.approx(_load(jobs, 8), rel=1e-9)
        assert 0.5 * spec.load < measured < 2 * spec.load
    # every kept episode ranks: its heuristics are more than 0.1% apart
    for i in range(len(vs.specs)):
        row = [vs.objs[h][i] for h in HEURISTICS]
        assert max(row) > 1.001 * min(row)
        assert vs.best_obj[i] == min(row) and vs.objs[vs.best_heuristic[i]][i] == min(row)


def test_same_seed_same_episodes(tmp_path: Path) -> None:
    traces, clusters = _worlds(tmp_path)
    traces, clusters = traces[:1], clusters[:1]
    run = _objs(traces, clusters)
    a = validation_set(traces, clusters, CFG, 3, [7, 0], run, HEURISTICS)
    b = validation_set(traces, clusters, CFG, 3, [7, 0], run, HEURISTICS)
    c = validation_set(traces, clusters, CFG, 3, [8, 0], run, HEURISTICS)
    assert a.specs == b.specs and a.best_obj == b.best_obj
    assert [s.start for s in a.specs] != [s.start for s in c.specs]
