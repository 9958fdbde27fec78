"""Training episodes: a slice of a trace on one cluster, started loaded.

An episode (RLTune's and RLScheduler's setup, on the project's simulator and
placement code): take `prefix + jobs` consecutive jobs of the trace, thinned
at random so that their demand is `load` x the cluster's capacity, replay the
prefix under the baseline heuristic (the cluster fills and the history of run
times builds up), then let the learned policy rank every round from the first
episode job's arrival until the queue drains. The same jobs are run once more
under the baseline alone; the reward is the improvement of the objective over
that run, relative to it, on the jobs both runs still had to schedule at the
switch (the prefix is the same in both, so those are the same jobs).

Objectives (`OBJECTIVES`): avg bounded slowdown (default), avg queueing
delay, avg JCT (lower is better), and GPU utilisation over the episode's
submission span (higher is better).

With `offload_reward` W > 0 the reward also has the offload part of
shared/offload_signal.py over the offloading jobs among those same jobs:
W · (part under the policy − part under the baseline), the part being
− share of GPU time lost to unhidden migrations − 0.1 · (1 − hit rate).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.scoring.rl.args import OBJECTIVES
from services.scoring.rl.network import ScoreNet
from services.scoring.rl.policy import RLPolicy, Step
from shared.cluster import ClusterSpec
from shared.metrics import JobRecord
from shared.offload_signal import OffloadPart, offload_part
from shared.policy_api import Observation, Policy, PolicyContext, QueuedJob
from shared.sim import SimConfig, SimResult, simulate
from shared.sim.load import capacity
from shared.traces import TraceJob

__all__ = [
    "OBJECTIVES",
    "EpisodeConfig",
    "EpisodeResult",
    "EpisodeSpec",
    "Switch",
    "build_episode",
    "capacity",
    "demand",
    "objective",
    "run_episode",
]


@dataclass(frozen=True)
class EpisodeConfig:
    prefix: int = 256  # jobs replayed under the baseline before the policy takes over
    jobs: int = 256  # jobs whose rounds the policy decides
    load_lo: float = 0.8  # demand / capacity of an episode (`demand`), uniform in [lo, hi]
    load_hi: float = 1.2
    baseline: str = "sjf-est"  # the heuristic of the prefix and of the reward
    objective: str = "bsld"
    placer: str = "greedy"
    window: int = 128
    offload_reward: float = 0.0  # W of the offload part (module doc); 0: off


@dataclass(frozen=True)
class EpisodeSpec:
    cluster: int  # index into the training clusters
    start: int  # index of the first job (of the prefix) in the training jobs
    load: float
    seed: int


@dataclass
class EpisodeResult:
    spec: EpisodeSpec
    steps: list[Step]
    reward: float
    policy_obj: float
    baseline_obj: float
    jobs: int  # jobs simulated (both runs count once)
    decisions: int  # rounds the policy ranked
    sim_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def demand(jobs: Sequence[TraceJob]) -> float:
    """Reference GPUs asked for on average over the jobs' submission span, counting only
    the part of each job's run that falls inside it (a month-long job submitted near
    the end of a one-day span loads that day with hours, not a month)."""
    if len(jobs) < 2:
        return 0.0
    end = jobs[-1].submit_s
    span = max(end - jobs[0].submit_s, 1.0)
    return (
        sum(j.num_gpus * j.gpu_milli / 1000.0 * min(j.duration_s or 0.0, end - j.submit_s)
            for j in jobs)
        / span
    )  # fmt: skip


def build_episode(
    trace: Sequence[TraceJob], cluster: ClusterSpec, spec: EpisodeSpec, cfg: EpisodeConfig
) -> tuple[list[TraceJob], int]:
    """(jobs, prefix length): the thinned slice of `trace` from `spec.start`."""
    want = cfg.prefix + cfg.jobs
    raw = trace[spec.start : spec.start + 4 * want]
    keep = min(1.0, spec.load * capacity(cluster) / max(demand(raw), 1e-9))
    rng = np.random.default_rng(spec.seed)
    picked = [j for j, u in zip(raw, rng.random(len(raw)), strict=True) if u < keep][:want]
    return picked, min(cfg.prefix, max(len(picked) - 1, 0))


class Switch:
    """The baseline before `at`, the learned policy from then on (both see every job)."""

    oracle = False
    time_invariant = False
    preemptive = False
    name = "switch"

    def __init__(self, before: Policy, after: Policy, at: float) -> None:
        self.before, self.after, self.at = before, after, at

    @property
    def label(self) -> str:
        return f"{self.before.label}->{self.after.label}"

    def reset(self, ctx: PolicyContext) -> None:
        self.before.reset(ctx)
        self.after.reset(ctx)

    def add(self, job: QueuedJob) -> None:
        self.before.add(job)
        self.after.add(job)

    def remove(self, job: QueuedJob) -> None:
        self.before.remove(job)
        self.after.remove(job)

    def window(self, k: int, obs: Observation) -> Iterable[QueuedJob]:
        return (self.before if obs.now < self.at else self.after).window(k, obs)


class _Keep:
    """Records the rounds whose order could matter: two or more jobs ranked, at
    least one read, and not every ranked job started."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.rounds = 0
        self._open: Step | None = None
        self._left = 0

    def record(self, step: Step, now: float) -> None:
        self._close()
        self.rounds += 1
        self._open, self._left = step, len(step.pool)

    def removed(self, seq: int) -> None:
        if self._open is not None:
            self._left -= 1

    def _close(self) -> None:
        s = self._open
        if s is not None and len(s.pool) >= 2 and s.pulled >= 1 and self._left > 0:
            self.steps.append(s)
        self._open = None

    def finish(self) -> list[Step]:
        self._close()
        return self.steps


def objective(records: Sequence[JobRecord], which: str, seqs: set[int], total_gpus: int) -> float:
    """The objective over the jobs `seqs` (indices into `records`)."""
    recs = [records[i] for i in sorted(seqs) if records[i].finished]
    if not recs:
        return math.nan
    if which == "bsld":
        return float(np.mean([r.bsld for r in recs]))
    if which == "queue":
        return float(np.mean([r.queue_s for r in recs]))
    if which == "jct":
        return float(np.mean([r.jct_s for r in recs]))
    if which == "util":
        lo = min(r.submit_s for r in recs)
        hi = max(r.submit_s for r in recs)
        span = max(hi - lo, 1.0)
        held = sum(
            r.gpus * max(0.0, min(s.finish_s, hi) - max(s.start_s, lo))
            for r in records
            for s in r.segments
        )
        return held / (total_gpus * span)
    raise ValueError(f"unknown objective {which!r}; choose from {', '.join(OBJECTIVES)}")


def relative_gain(which: str, policy: float, base: float) -> float:
    """How much better `policy` is than `base`, relative to `base` (positive: better)."""
    if not (math.isfinite(policy) and math.isfinite(base)) or base <= 0:
        return 0.0
    return (policy - base) / base if which == "util" else (base - policy) / base


def run_episode(
    trace: Sequence[TraceJob],
    clusters: Sequence[ClusterSpec],
    spec: EpisodeSpec,
    cfg: EpisodeConfig,
    net: ScoreNet,
    features: Sequence[str],
    sample: bool = True,
) -> EpisodeResult:
    cluster = clusters[spec.cluster]
    jobs, n_prefix = build_episode(trace, cluster, spec, cfg)
    at = jobs[n_prefix].submit_s
    sim_cfg = SimConfig(window=cfg.window, seed=spec.seed)
    base = simulate(jobs, cluster, make_policy(cfg.baseline), make_placer(cfg.placer), sim_cfg)
    # the jobs still to schedule at the switch: the same in both runs
    todo = {
        i
        for i, r in enumerate(base.records)
        if (r.segments and r.segments[0].start_s >= at) or not r.segments
    }
    learned = RLPolicy(net, features, sample=sample, max_jobs=cfg.window)
    keep = _Keep()
    learned.recorder = keep
    run = simulate(
        jobs,
        cluster,
        Switch(make_policy(cfg.baseline), learned, at),
        make_placer(cfg.placer),
        sim_cfg,
    )
    b = objective(base.records, cfg.objective, todo, cluster.total_gpus)
    p = objective(run.records, cfg.objective, todo, cluster.total_gpus)
    steps = keep.finish()
    reward = max(relative_gain(cfg.objective, p, b), -1.0)  # a disaster counts as -100%
    extra: dict[str, float] = {}
    if cfg.offload_reward > 0:
        ids = {base.records[i].job_id for i in todo}
        pb, pp = _offload_part(base, ids), _offload_part(run, ids)
        extra = {"offload_part": pp.value, "offload_part_baseline": pb.value}
        reward += cfg.offload_reward * (pp.value - pb.value)
    return EpisodeResult(
        spec,
        steps,
        reward,
        p,
        b,
        jobs=len(jobs),
        decisions=keep.rounds,
        sim_s=base.wall_s + run.wall_s,
        extra=extra,
    )


def _offload_part(res: SimResult, ids: set[str]) -> OffloadPart:
    """The reward's offload part over the offloading jobs among `ids`."""
    recs = (r for job_id, r in res.offload.items() if job_id in ids)
    return offload_part((r.run_s, r.unhidden_s, r.hit_rate) for r in recs)
