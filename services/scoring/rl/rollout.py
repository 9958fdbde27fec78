"""Rollouts from several simulator processes at once, and the batch they make.

Each worker process reads the training traces and clusters once, then runs
whole episodes (`env.run_episode`) for the weights it is sent. Results come
back in the order the episodes were asked for, whatever finishes first, so a
run is deterministic for a seed with any number of workers. `workers=0` runs
in this process (tests).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from services.scoring.rl.env import EpisodeConfig, EpisodeResult, EpisodeSpec, run_episode
from services.scoring.rl.network import NetConfig, ScoreNet
from shared.cluster import ClusterSpec
from shared.policy_features import JOB_FEATURES
from shared.traces import TraceJob

__all__ = [
    "ORACLE_TEACHERS",
    "TEACHERS",
    "Batch",
    "Rollouts",
    "make_batch",
    "sjf_est_ranking",
    "teacher_ranking",
]

_GROUP_RUN = JOB_FEATURES.index("log_mean_run_group_s")
_WAIT = JOB_FEATURES.index("log_wait_s")
_VC_SHARE = JOB_FEATURES.index("vc_share")


def sjf_est_ranking(x: np.ndarray) -> np.ndarray:
    """The `sjf-est` order of rows of all JOB_FEATURES: the group's mean run time
    (0 without history), then the longest wait first."""
    return np.lexsort((-x[:, _WAIT], x[:, _GROUP_RUN])).astype(np.int64)


def drf_ranking(x: np.ndarray) -> np.ndarray:
    """The `drf` order (queue weights 1): the VC holding the fewest GPUs first, then
    the longest wait first."""
    return np.lexsort((-x[:, _WAIT], x[:, _VC_SHARE])).astype(np.int64)


def drf_sjf_ranking(x: np.ndarray) -> np.ndarray:
    """`drf` across VCs, `sjf-est` within one."""
    return np.lexsort((-x[:, _WAIT], x[:, _GROUP_RUN], x[:, _VC_SHARE])).astype(np.int64)


def sjf_oracle_ranking(x: np.ndarray, run_s: np.ndarray) -> np.ndarray:
    """The `sjf-oracle` order: the shortest true run time first, then submit order
    (the rows of `x` are in (submit, seq) order, RLPolicy.candidates)."""
    return np.lexsort((np.arange(len(x)), run_s)).astype(np.int64)


def drf_oracle_ranking(x: np.ndarray, run_s: np.ndarray) -> np.ndarray:
    """`drf` across VCs, `sjf-oracle` within one."""
    return np.lexsort((np.arange(len(x)), run_s, x[:, _VC_SHARE])).astype(np.int64)


TEACHERS = {"sjf-est": sjf_est_ranking, "drf": drf_ranking, "drf-sjf": drf_sjf_ranking}
# privileged teachers: they read the true run times of the round's jobs, which the
# trainer has (it built the episode) and the network never does (Step holds none)
ORACLE_TEACHERS = {"sjf-oracle": sjf_oracle_ranking, "drf-oracle": drf_oracle_ranking}


def teacher_ranking(name: str, x: np.ndarray, run_s: np.ndarray | None = None) -> np.ndarray:
    """The ranking heuristic `name` (a key of TEACHERS or ORACLE_TEACHERS) gives the
    rows of `x`; an oracle teacher also reads `run_s`, the rows' true run times."""
    if name in ORACLE_TEACHERS:
        if run_s is None:
            raise ValueError(f"teacher {name!r} needs the true run times of the round's jobs")
        return ORACLE_TEACHERS[name](x, run_s)
    return TEACHERS[name](x)


_WORLD: dict[str, Any] = {}


# the jobs of each world and its cluster: episode `spec` runs `traces[spec.cluster]`
# on `clusters[spec.cluster]` (one trace on several clusters repeats the list)
Worlds = tuple[Sequence[Sequence[TraceJob]], Sequence[ClusterSpec]]


def _init(loader: Callable[[], Worlds]) -> None:
    torch.set_num_threads(1)
    _WORLD["traces"], _WORLD["clusters"] = loader()


def _episode(
    spec: EpisodeSpec,
    cfg: EpisodeConfig,
    net_cfg: dict[str, Any],
    weights: dict[str, torch.Tensor],
    features: tuple[str, ...],
    sample: bool,
) -> EpisodeResult:
    net = ScoreNet(NetConfig(**net_cfg))
    net.load_state_dict(weights)
    trace = _WORLD["traces"][spec.cluster]
    return run_episode(trace, _WORLD["clusters"], spec, cfg, net, features, sample=sample)


class Rollouts:
    """A pool of `workers` simulator processes (0: run in this process)."""

    def __init__(self, loader: Callable[[], Worlds], workers: int) -> None:
        self.workers = workers
        self._pool: Executor | None = None
        self._world: Worlds | None = None
        if workers > 0:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                workers, mp_context=ctx, initializer=_init, initargs=(loader,)
            )
        else:
            self._world = loader()

    def run(
        self,
        specs: Sequence[EpisodeSpec],
        cfg: EpisodeConfig,
        net: ScoreNet,
        features: tuple[str, ...],
        sample: bool = True,
    ) -> list[EpisodeResult]:
        weights = {k: v.detach().clone() for k, v in net.state_dict().items()}
        args = (cfg, net.cfg.to_dict(), weights, features, sample)
        if self._pool is None:
            assert self._world is not None
            traces, clusters = self._world
            return [
                run_episode(traces[s.cluster], clusters, s, cfg, net, features, sample)
                for s in specs
            ]
        futures = [self._pool.submit(_episode, s, *args) for s in specs]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


@dataclass
class Batch:
    """Every kept step of one iteration, padded to the largest window in it."""

    x: torch.Tensor  # [T, N, F] job features (raw; the network normalises)
    mask: torch.Tensor  # [T, N] bool
    g: torch.Tensor  # [T, G] cluster features
    perm: torch.Tensor  # [T, N] the drawn ranking, empty slots last
    pulled: torch.Tensor  # [T] ranks the simulator read
    teacher: torch.Tensor  # [T, N] the teacher heuristic's ranking of the same jobs
    rewards: np.ndarray  # [T] per-round rewards, or the episode's reward on its last step
    ends: np.ndarray  # [T] bool: last step of an episode

    def __len__(self) -> int:
        return int(self.x.shape[0])


def make_batch(
    results: Sequence[EpisodeResult], features: Sequence[str], teacher_name: str = "sjf-est"
) -> Batch | None:
    """Stack the episodes' steps (an episode with none contributes nothing), keeping
    the job-feature columns `features` (steps record all of JOB_FEATURES), with the
    `teacher_name` heuristic's ranking of each step (the warm start imitates it).
    An episode with `step_rewards` (one per step, env.round_rewards) spreads its
    reward over its rounds; otherwise the whole reward is on its last step. An
    oracle teacher reads the episode's `run_s` (true run time by job seq)."""
    steps = [(r, s, j) for r in results for j, s in enumerate(r.steps)]
    if not steps:
        return None
    n = max(len(s.pool) for _, s, _ in steps)
    t = len(steps)
    cols = np.asarray([JOB_FEATURES.index(name) for name in features], dtype=np.int64)
    f = len(cols)
    x = np.zeros((t, n, f), dtype=np.float32)
    mask = np.zeros((t, n), dtype=bool)
    g = np.stack([s.g for _, s, _ in steps]).astype(np.float32)
    perm = np.tile(np.arange(n, dtype=np.int64), (t, 1))
    pulled = np.zeros(t, dtype=np.int64)
    teacher = perm.copy()
    rewards = np.zeros(t, dtype=np.float64)
    ends = np.zeros(t, dtype=bool)
    for i, (res, s, j) in enumerate(steps):
        k = len(s.pool)
        x[i, :k] = s.x[:, cols]
        mask[i, :k] = True
        perm[i, :k] = s.perm[:k]
        pulled[i] = s.pulled
        run_s = getattr(res, "run_s", None)
        truth = run_s[np.asarray(s.pool, dtype=np.int64)] if run_s is not None else None
        own = getattr(s, "teacher", None)
        if own is not None:  # a heuristic policy rode along (env.EpisodeConfig.teacher)
            teacher[i, :k] = own
        elif teacher_name in TEACHERS or teacher_name in ORACLE_TEACHERS:
            teacher[i, :k] = teacher_ranking(teacher_name, s.x, truth)
        dense = getattr(res, "step_rewards", None)
        if dense is not None:
            rewards[i] = dense[j]
        if j == len(res.steps) - 1:
            ends[i] = True
            if dense is None:
                rewards[i] = res.reward
    return Batch(
        torch.from_numpy(x),
        torch.from_numpy(mask),
        torch.from_numpy(g),
        torch.from_numpy(perm),
        torch.from_numpy(pulled),
        torch.from_numpy(teacher),
        rewards,
        ends,
    )
