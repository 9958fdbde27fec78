"""Training episodes: a slice of a trace on one cluster, started loaded.

An episode (RLTune's and RLScheduler's setup, on the project's simulator and
placement code): take `prefix + jobs` consecutive jobs of the trace, thinned
at random so that their demand is `load` x the cluster's capacity (a slice
whose demand is below that keeps every job and has its arrivals compressed
to that load, `shared.sim.load.compress_to_load`), replay the
prefix under the baseline heuristic (the cluster fills and the history of run
times builds up), then let the learned policy rank every round from the first
episode job's arrival until the queue drains. The same jobs are run once more
under the baseline alone; the reward is the improvement of the objective over
that run, relative to it, on the jobs both runs still had to schedule at the
switch (the prefix is the same in both, so those are the same jobs).

A slice too sparse for its load even compressed (its jobs, however close
together, cannot keep the cluster that busy: 512 Philly jobs reach 0.2-0.4 of
its 640 GPUs) would teach nothing about a queue; with `fill_load` such an
episode takes twice as many jobs, and again, until the slice can reach the load
(`episode_size`; at most `FILL_MAX` times `prefix + jobs`). The policy then
ranks every round after the prefix, as in any episode.

Per-round credit (`EpisodeConfig.dense`): the same reward, split over the
rounds the policy ranked (`round_rewards`). For a per-job objective (bsld,
queue, jct) the relative gain is a sum over jobs, (mean_b - mean_p) / mean_b =
sum_j (v_b(j) / n_b - v_p(j) / n_p) / mean_b, and each job's term goes to the
last recorded round at or before the job started under the policy (a job that
never started: the last round). A round's return-to-go (gamma = 1) then counts
only the jobs still waiting when it was decided, which its ranking could
change; the terms of jobs already running are left out of it, so PPO's
advantages carry less of the noise that whole-episode credit carries. The
rounds' rewards add up to the episode's reward exactly, which stays the figure
reported. `util` (not a sum over jobs) keeps the reward on the last round.

Objectives (`OBJECTIVES`): avg bounded slowdown (default), avg queueing
delay, avg JCT (lower is better), and GPU utilisation over the episode's
submission span (higher is better).

With `offload_reward` W > 0 the reward also has the offload part of
shared/offload_signal.py over the offloading jobs among those same jobs:
W · (part under the policy − part under the baseline), the part being
− share of GPU time lost to unhidden migrations − 0.1 · (1 − hit rate).
"""

from __future__ import annotations

import bisect
import itertools
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
from shared.errors import UserError
from shared.metrics import JobRecord
from shared.offload_signal import OffloadPart, offload_part
from shared.policy_api import Observation, Policy, PolicyContext, QueuedJob
from shared.sim import SimConfig, SimResult, simulate
from shared.sim.load import capacity, compress_to_load, span_load_limit
from shared.traces import TraceJob, lacking_fields

__all__ = [
    "FILL_MAX",
    "OBJECTIVES",
    "EpisodeConfig",
    "EpisodeResult",
    "EpisodeSpec",
    "Switch",
    "build_episode",
    "capacity",
    "demand",
    "episode_size",
    "episode_teacher",
    "objective",
    "round_rewards",
    "run_episode",
    "shuffle_ties",
]


FILL_MAX = 8  # `fill_load`'s most jobs per episode, in units of prefix + jobs


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
    dense: bool = False  # split the reward over the rounds (module doc, `round_rewards`)
    shuffle_ties: bool = False  # jobs of one submit second in a seeded random order
    # a heuristic that ranks every recorded round beside the network (Step.teacher), for
    # the warm start: a policy name, or "best:a,b,c", the one of those whose own run of
    # the episode has the best objective (DAgger on the best heuristic per episode);
    # "": none
    teacher: str = ""
    # a slice quieter than its load has its arrivals compressed to it (module doc);
    # False: arrivals as recorded (a hand-solved instance's fixed schedule)
    compress: bool = True
    # a slice whose `prefix + jobs` jobs cannot reach the load even compressed (their
    # `span_load_limit` is below it: 512 Philly jobs on its 640 GPUs reach 0.2-0.4)
    # takes twice as many jobs, and again, up to FILL_MAX times as many, so that the
    # episode queues as the load says (module doc); False: `prefix + jobs` jobs always
    fill_load: bool = False


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
    # per kept step, summing to `reward` (EpisodeConfig.dense); None: all on the last
    step_rewards: np.ndarray | None = None
    # the true run time (reference type) of every episode job, by simulator seq: the
    # trainer's, for a privileged teacher's ranking only; never an input of the network
    run_s: np.ndarray | None = None


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


def episode_size(
    trace: Sequence[TraceJob], cluster: ClusterSpec, spec: EpisodeSpec, cfg: EpisodeConfig
) -> int:
    """Jobs the episode takes from `spec.start`: `prefix + jobs`, or with `fill_load`
    the first of that x 2^k (k = 0.., at most FILL_MAX times it, and no further than
    the trace's end) whose slice can reach the load (`span_load_limit` >= load / 0.99,
    the margin `build_episode` compresses to when it cannot)."""
    want = cfg.prefix + cfg.jobs
    if not cfg.fill_load:
        return want
    top = FILL_MAX * want
    while (
        want < top
        and spec.start + want < len(trace)
        and span_load_limit(trace[spec.start : spec.start + want], cluster) * 0.99 < spec.load
    ):
        want = min(2 * want, top)
    return want


def build_episode(
    trace: Sequence[TraceJob], cluster: ClusterSpec, spec: EpisodeSpec, cfg: EpisodeConfig
) -> tuple[list[TraceJob], int]:
    """(jobs, prefix length): the thinned slice of `trace` from `spec.start`
    (`episode_size` jobs)."""
    want = episode_size(trace, cluster, spec, cfg)
    raw = trace[spec.start : spec.start + 4 * want]
    keep = min(1.0, spec.load * capacity(cluster) / max(demand(raw), 1e-9))
    rng = np.random.default_rng(spec.seed)
    picked = [j for j, u in zip(raw, rng.random(len(raw)), strict=True) if u < keep][:want]
    if cfg.compress and keep >= 1.0 and 0.0 < demand(picked) < spec.load * capacity(cluster):
        # a quiet slice (ThetaGPU runs at 0.4): thinning cannot raise its load, so the
        # arrivals are compressed to it instead (the same measure, `demand`, is
        # `span_load` x capacity); left as recorded, every order would give the same
        # schedule and the episode would teach nothing
        try:
            picked, _ = compress_to_load(picked, cluster, spec.load, "span")
        except UserError:  # beyond what compressing reaches: as far as it goes
            top = 0.99 * span_load_limit(picked, cluster)
            picked, _ = compress_to_load(picked, cluster, top, "span")
    if cfg.shuffle_ties:
        picked = shuffle_ties(picked, rng)
    return picked, min(cfg.prefix, max(len(picked) - 1, 0))


def shuffle_ties(jobs: Sequence[TraceJob], rng: np.random.Generator) -> list[TraceJob]:
    """`jobs` by submit time, those of one second in a random order: a trace's order
    of same-second submissions is arbitrary, and every policy breaks ties by it."""
    ordered = sorted(jobs, key=lambda j: j.submit_s)  # stable: the trace's order
    out: list[TraceJob] = []
    for _, same in itertools.groupby(ordered, key=lambda j: j.submit_s):
        group = list(same)
        out += [group[i] for i in rng.permutation(len(group))] if len(group) > 1 else group
    return out


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
        self.times: list[float] = []  # when each kept step was decided
        self.rounds = 0
        self._open: Step | None = None
        self._left = 0

    def record(self, step: Step, now: float) -> None:
        self._close()
        self.rounds += 1
        self._open, self._left, self._now = step, len(step.pool), now

    def removed(self, seq: int) -> None:
        if self._open is not None:
            self._left -= 1

    def _close(self) -> None:
        s = self._open
        if s is not None and len(s.pool) >= 2 and s.pulled >= 1 and self._left > 0:
            self.steps.append(s)
            self.times.append(self._now)
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


_PER_JOB = {"bsld": "bsld", "queue": "queue_s", "jct": "jct_s"}


def round_rewards(
    base: Sequence[JobRecord],
    run: Sequence[JobRecord],
    seqs: set[int],
    which: str,
    times: Sequence[float],
    reward: float,
) -> np.ndarray:
    """The episode's `reward` split over the kept rounds decided at `times`
    (ascending): each job of `seqs` adds (v_b / n_b - v_p / n_p) / mean_b to the last
    round at or before its start under the policy (module doc). The terms add up to
    the relative gain; they are scaled to `reward` when that differs (the -100%
    floor), and whatever is left (an offload part, a `util` objective) goes to the
    last round."""
    out = np.zeros(len(times), dtype=np.float64)
    if not len(times):
        return out
    attr = _PER_JOB.get(which)
    fb = [i for i in sorted(seqs) if base[i].finished]
    fp = [i for i in sorted(seqs) if run[i].finished]
    if attr is None or not fb or not fp:
        out[-1] = reward
        return out
    mean_b = float(np.mean([getattr(base[i], attr) for i in fb]))
    gain = relative_gain(which, float(np.mean([getattr(run[i], attr) for i in fp])), mean_b)
    if mean_b <= 0 or gain == 0.0:
        out[-1] = reward
        return out
    last = len(times) - 1

    def slot(i: int) -> int:
        segs = run[i].segments
        if not segs:
            return last
        return min(max(bisect.bisect_right(times, segs[0].start_s) - 1, 0), last)

    for i in fb:
        out[slot(i)] += getattr(base[i], attr) / (len(fb) * mean_b)
    for i in fp:
        out[slot(i)] -= getattr(run[i], attr) / (len(fp) * mean_b)
    own = max(gain, -1.0)  # the objective's part of `reward` (run_episode's floor)
    out *= own / gain
    out[-1] += reward - own
    return out


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
    if cfg.teacher:
        learned.teacher = make_policy(
            episode_teacher(cfg.teacher, jobs, cluster, todo, cfg, sim_cfg, base)
        )
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
    dense = None
    if cfg.dense:
        dense = round_rewards(base.records, run.records, todo, cfg.objective, keep.times, reward)
    ordered = sorted(jobs, key=lambda j: j.submit_s)  # the simulator's seq order
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
        step_rewards=dense,
        run_s=np.asarray([j.duration_s or 0.0 for j in ordered], dtype=np.float64),
    )


def episode_teacher(
    teacher: str,
    jobs: Sequence[TraceJob],
    cluster: ClusterSpec,
    todo: set[int],
    cfg: EpisodeConfig,
    sim_cfg: SimConfig,
    base: SimResult,
) -> str:
    """The heuristic `teacher` names for this episode: itself, or of "best:a,b,..." the
    one whose own run of the episode (prefix included) has the best objective over
    the jobs `todo` (the baseline's run `base` is reused for the baseline's name)."""
    names = teacher.removeprefix("best:").split(",")
    if len(names) == 1:
        return names[0]
    best: tuple[float, str] | None = None
    for name in names:
        policy = make_policy(name)
        if lacking_fields(getattr(policy, "needs", ()), jobs):
            continue  # sjf-req on a trace without requested times
        res = base if name == cfg.baseline else simulate(
            jobs, cluster, policy, make_placer(cfg.placer), sim_cfg
        )  # fmt: skip
        obj = objective(res.records, cfg.objective, todo, cluster.total_gpus)
        key = -obj if cfg.objective == "util" else obj
        if math.isfinite(key) and (best is None or key < best[0]):
            best = (key, name)
    return names[0] if best is None else best[1]


def _offload_part(res: SimResult, ids: set[str]) -> OffloadPart:
    """The reward's offload part over the offloading jobs among `ids`."""
    recs = (r for job_id, r in res.offload.items() if job_id in ids)
    return offload_part((r.run_s, r.unhidden_s, r.hit_rate) for r in recs)
