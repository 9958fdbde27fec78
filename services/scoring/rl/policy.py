"""`rl`: the learned prioritisation policy, the same `Policy` object as every
baseline (shared.policy_api), so simulate, eval, train and the scoring service
use it unchanged.

How a decision maps onto a round: the whole window is ranked at once, by
Plackett-Luce (sampling without replacement from the masked softmax of the
scores while training; sorted by score, the most likely ranking, when serving).
Chosen over one job per decision (RLTune's) because a round here is one ordered
window handed to placement (DESIGN.md, "Scheduling round"): ranking needs one
forward pass per round instead of one per started job, so scoring a 128-job
window stays far below the 2 ms a round may wait on it, and the log-probability
of a ranking is exact (a sum over the ranks the simulator read) so PPO needs no
approximation. Picking one job per decision would also need the features to be
recomputed against GPUs the placer has not yet given out.

Which jobs it sees: up to `max_jobs` waiting jobs. When more wait, the oldest
job of every group (same user/VC, GPU count, share and allowed types: jobs the
features cannot tell apart except by age) comes first, then the oldest others,
so that a short job deep in a long queue can still be seen. Within a group the
scores differ only by age. A residual network on `drf` (`NetConfig.base`, see
network.py) sees instead the first `max_jobs` jobs of `drf`'s own order (VCs by GPUs
held, FIFO within a VC and across tied VCs), so that untrained it hands placement
exactly `drf`'s window. A residual network on `f1` likewise sees the first `max_jobs`
of `f1`'s own order (an `F1` policy kept beside it, seeing every job), and encodes
`f1`'s raw inputs with the first submit it saw as their origin, as `F1` does.

The wait bound (`max_wait_s`, aging of large jobs): a job of at least
`bound_gpus` GPUs that has waited `max_wait_s` or longer is put ahead of every
job the network ranks, the oldest first, so that under EASY it is the one that
gets the reservation; the network ranks the rest (the bound looks at every waiting
job, not only the window the network ranks). None (the default): no bound.
It bounds what the reward (a mean over jobs) does not see, the longest waits,
which fall on the largest jobs. Applied to every job it is FIFO for every job
past the bound, which on a loaded cluster is most of the queue (measured on the
validation slice: bounded slowdown 2.7x, docs/results/rl.md); hence the size threshold.
The recorded round (`Step`) holds only the jobs the network ranked, so PPO's
log-probabilities are those of its own choices. `bound_scale="backlog"` scales the
bound with the load the policy sees: `max_wait_s x (1 + waiting GPUs / cluster
GPUs)` at each round, so that on a cluster whose queue holds more work than it has
GPUs a large job is put ahead later (each one put ahead under EASY holds a
reservation that idles GPUs; a fixed bound fired on most large jobs at a load of
1.18 and cost 37% of bounded slowdown there, docs/results/rl-selection.md).
`bound_scale="fifo"` reads the bound from EASY `fifo`'s order instead
(`shadow.FifoShadow`): a large job goes ahead once its turn has come in a replay of
the same jobs through EASY FIFO with run times estimated from history (it would be
the head EASY reserves for, or would have started), or once it has waited
`max_wait_s` (a cap; None: no cap), whichever is first; so it gets the reservation
no later than under EASY `fifo`, as far as the estimates tell.
`bound_scale="fifo-head"` reads `fifo`'s order from the real queue instead: a large
job goes ahead when it is the oldest waiting job, the one EASY `fifo` would reserve
for (or once it has waited `max_wait_s`); no estimate is involved.

How it scores: the encoder (`shared.policy_features.encode`, vectorised over the
window) and the network's forward pass in numpy with the module's weights
(`network.WindowScorer`), the same numbers as the module's to float32 rounding,
at a fraction of PyTorch's per-call cost (`rl.reference` keeps the first path,
per-job encoder and PyTorch forward, which the tests and `rltune bench train`
compare against). Serving calls no PyTorch operation, so the policy leaves
torch's settings (threads) to its caller. Jobs with equal features (the same
kind, submitted in the same second) tie and the older goes first (see
`_equal_rows_tie`).

What it cannot see: its inputs are `QueuedJob`s and the `Observation` (through
`shared.policy_features`), and it is not an oracle, so the context it is reset
with is a plain `PolicyContext`, which carries no run time (only an oracle
policy is handed an `OracleContext`); `reset` keeps nothing of it but the seed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections.abc import Hashable, Iterator, Sequence
from typing import Protocol

import numpy as np

from services.scoring.policies.f1 import F1
from services.scoring.policies.f1_unicep import F1Unicep
from services.scoring.rl.args import BOUND_SCALES
from services.scoring.rl.network import KEY_BASES, ScoreNet, WindowScorer
from services.scoring.rl.ppo import sample_ranking
from services.scoring.rl.shadow import FifoShadow
from shared.cluster import ClusterSpec
from shared.errors import UserError
from shared.policy_api import History, Observation, Policy, PolicyContext, QueuedJob
from shared.policy_features import (
    IDENTITY_FEATURES,
    JOB_FEATURES,
    encode,
    encode_global,
    needs_of,
)

__all__ = ["RLPolicy", "Recorder", "Step"]


class Step:
    """One recorded round: what the network saw and the ranking it drew."""

    __slots__ = ("g", "perm", "pool", "pulled", "teacher", "x")

    def __init__(self, x: np.ndarray, g: np.ndarray, perm: np.ndarray, pool: list[int]) -> None:
        self.x, self.g, self.perm, self.pool = x, g, perm, pool
        self.pulled = 0  # ranks the simulator read
        # a teacher policy's ranking of the same jobs (indices into pool), if one rode along
        self.teacher: np.ndarray | None = None


class Recorder(Protocol):
    def record(self, step: Step, now: float) -> None: ...

    def removed(self, seq: int) -> None: ...


class RLPolicy:
    name = "rl"
    oracle = False
    time_invariant = False  # waits grow with time, and the scores read them
    preemptive = False

    def __init__(
        self,
        net: ScoreNet,
        features: Sequence[str],
        label: str = "rl",
        max_jobs: int = 128,
        sample: bool = False,
        max_wait_s: float | None = None,
        bound_gpus: int = 1,
        bound_scale: str = "fixed",
        needs: Sequence[str] | None = None,
    ) -> None:
        if bound_scale not in BOUND_SCALES:
            raise UserError(f"bound scale {bound_scale!r}: choose from {', '.join(BOUND_SCALES)}")
        self.net = net.eval()
        self._scorer = WindowScorer(net)
        self.features = tuple(features)
        # the trace fields its features read: a run on a trace without them is refused
        # (`shared.traces.require_fields`); a checkpoint trained on traces with and
        # without them names what it really needs instead (its meta's `needs`)
        self.needs = needs_of(self.features) if needs is None else tuple(needs)
        self.reads_identity = bool(set(self.features) & set(IDENTITY_FEATURES))
        self.columns = np.asarray([JOB_FEATURES.index(f) for f in self.features], dtype=np.int64)
        self._label = label
        self.max_jobs = max_jobs
        self.sample = sample
        self.max_wait_s = max_wait_s
        self.bound_gpus = bound_gpus
        self.bound_scale = bound_scale
        self.recorder: Recorder | None = None
        # a heuristic that sees the same jobs and ranks each recorded round too (the
        # warm start imitates it; `Step.teacher`); it never changes what is handed out
        self.teacher: Policy | None = None
        self.reset_state(0)

    @property
    def label(self) -> str:
        return self._label

    # ---- the waiting queue --------------------------------------------------------------
    def reset(self, ctx: PolicyContext) -> None:
        """Forget every job; of `ctx` the seed is kept, and the cluster's queue weights
        are checked against a `drf` base (which ranks VCs with weights 1)."""
        if self.net.cfg.base == "drf":
            weighted = sorted(q for q, spec in ctx.cluster.queues.items() if spec.weight != 1.0)
            if weighted:
                raise UserError(
                    f"{self.label}: a residual on drf ranks VCs as if every queue weight "
                    f"were 1, and cluster {ctx.cluster.name!r} weights "
                    f"{', '.join(weighted)}; use a policy trained without --residual"
                )
        self.reset_state(ctx.seed)
        if self._f1 is not None:
            self._f1.reset(ctx)
        if self.teacher is not None:
            self.teacher.reset(ctx)

    def reset_state(self, seed: int) -> None:
        self._fifo: dict[int, QueuedJob] = {}
        self._groups: dict[Hashable, dict[int, QueuedJob]] = {}
        self._vcs: dict[str, dict[int, QueuedJob]] = {}  # FIFO per VC (the drf base)
        self._big: dict[int, QueuedJob] = {}  # jobs the wait bound applies to, FIFO
        self._shadow = FifoShadow(self.max_jobs) if self.bound_scale == "fifo" else None
        self._rng = np.random.default_rng(seed)
        self.origin_s: float | None = None  # the first submit seen (f1's origin)
        # f1's (or f1-unicep's) own order: the window of a residual on it
        self._f1: F1 | F1Unicep | None = None
        if self.net.cfg.base in KEY_BASES:
            self._f1 = F1() if self.net.cfg.base == "f1" else F1Unicep()
            # f1 reads nothing of its context; `reset` gives it the run's
            self._f1.reset(PolicyContext(ClusterSpec("none", ()), History()))

    @staticmethod
    def _group(job: QueuedJob) -> Hashable:
        return (job.who, job.num_gpus, job.gpu_milli, job.gpu_types)

    def add(self, job: QueuedJob) -> None:
        if self.origin_s is None:
            self.origin_s = job.submit_s
        if self._f1 is not None:
            self._f1.add(job)
        self._fifo[job.seq] = job
        self._groups.setdefault(self._group(job), {})[job.seq] = job
        self._vcs.setdefault(job.vc, {})[job.seq] = job
        if job.num_gpus >= self.bound_gpus:
            self._big[job.seq] = job
        if self._shadow is not None:
            self._shadow.add(job)
        if self.teacher is not None:
            self.teacher.add(job)

    def remove(self, job: QueuedJob) -> None:
        del self._fifo[job.seq]
        key = self._group(job)
        group = self._groups[key]
        del group[job.seq]
        if not group:
            del self._groups[key]
        vc = self._vcs[job.vc]
        del vc[job.seq]
        if not vc:
            del self._vcs[job.vc]
        self._big.pop(job.seq, None)
        if self._f1 is not None:
            self._f1.remove(job)
        if self._shadow is not None:
            self._shadow.forget(job.seq)
        if self.recorder is not None:
            self.recorder.removed(job.seq)
        if self.teacher is not None:
            self.teacher.remove(job)

    def candidates(self, obs: Observation | None = None) -> list[QueuedJob]:
        """The jobs the network scores, in (submit, seq) order (a residual network on
        `drf`, given `obs`: the first `max_jobs` of drf's order; module doc)."""
        n = self.max_jobs
        if len(self._fifo) <= n:
            pool = list(self._fifo.values())
        elif obs is not None and self.net.cfg.base == "drf":
            pool = self._drf_head(n, obs)
        elif obs is not None and self._f1 is not None:
            pool = list(self._f1.window(n, obs))
        else:
            heads = [next(iter(g.values())) for g in self._groups.values()]
            heads.sort(key=_age)
            pool = heads[:n]
            if len(pool) < n:
                taken = {j.seq for j in pool}
                for job in self._fifo.values():
                    if job.seq not in taken:
                        pool.append(job)
                        if len(pool) == n:
                            break
        pool.sort(key=_age)
        return pool

    def _drf_head(self, n: int, obs: Observation) -> list[QueuedJob]:
        """The first `n` jobs of `drf`'s order (queue weights 1)."""
        by_held: dict[float, list[dict[int, QueuedJob]]] = {}
        for vc, fifo in self._vcs.items():
            by_held.setdefault(obs.vc_gpus(vc), []).append(fifo)
        pool: list[QueuedJob] = []
        for held in sorted(by_held):
            tied = by_held[held]
            # equal shares: FIFO across the tied VCs
            jobs: Iterator[QueuedJob] = (
                iter(tied[0].values())
                if len(tied) == 1
                else heapq.merge(*(q.values() for q in tied), key=_age)
            )
            pool += itertools.islice(jobs, n - len(pool))
            if len(pool) == n:
                break
        return pool

    def bound_s(self, obs: Observation) -> float:
        """The wait past which a job of `bound_gpus` or more goes ahead, this round
        (under "fifo", the cap; a job's turn in the shadow may come sooner)."""
        assert self.max_wait_s is not None
        if self.bound_scale == "backlog":
            return self.max_wait_s * (1.0 + obs.waiting_gpus() / max(obs.total_gpus(), 1))
        return self.max_wait_s

    def forced(self, obs: Observation) -> list[QueuedJob]:
        """The waiting jobs the wait bound puts ahead of the network this round, oldest
        first: of `bound_gpus` or more, waited `bound_s` or longer, or (under "fifo")
        their turn in the EASY fifo shadow has come, or (under "fifo-head") the oldest
        waiting job."""
        shadow = self._shadow
        if (self.max_wait_s is None and self.bound_scale not in _NO_CAP_NEEDED) or not self._big:
            return []
        bound = -math.inf if self.max_wait_s is None else obs.now - self.bound_s(obs)
        if self.bound_scale == "fifo-head":
            head = min(self._fifo.values(), key=_age)  # the job EASY fifo reserves for
            return sorted(
                (j for j in self._big.values() if j.submit_s <= bound or j is head), key=_age
            )
        if shadow is None:
            return sorted((j for j in self._big.values() if j.submit_s <= bound), key=_age)
        shadow.advance(obs.now, obs.total_gpus(), obs.history.estimate)
        out = []
        for j in self._big.values():
            turn = shadow.turn(j.seq)
            if j.submit_s <= bound or (turn is not None and turn <= obs.now):
                out.append(j)
        return sorted(out, key=_age)

    # ---- scoring ------------------------------------------------------------------------
    def unicep_keys(self) -> bool:
        """Whether the key columns carry unicep's key now: a residual on f1-unicep whose
        rule is on unicep (services/scoring/policies/f1_unicep.py)."""
        return isinstance(self._f1, F1Unicep) and not self._f1.uses_f1()

    def encode(self, pool: list[QueuedJob], obs: Observation) -> np.ndarray:
        """Every JOB_FEATURES column of the jobs of `pool` [len(pool), len(JOB_FEATURES)]
        (the IDENTITY_FEATURES ones 0 unless it reads one of them)."""
        origin = self.origin_s if self._f1 is not None else None
        x, _ = encode(pool, obs, len(pool), self.reads_identity, origin, self.unicep_keys())
        return x

    def scores(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Scores of the rows of `x` [n, len(JOB_FEATURES)] with cluster features `g`
        (the network's, in numpy: `network.WindowScorer`)."""
        return self._scorer(x[:, self.columns], g)

    def window(self, k: int, obs: Observation) -> Iterator[QueuedJob]:
        forced = self.forced(obs)
        pool = self.candidates(obs)
        if forced:
            ahead = {j.seq for j in forced}
            pool = [j for j in pool if j.seq not in ahead]
        if not pool:
            return iter(forced[:k])
        x = self.encode(pool, obs)
        g = encode_global(obs)
        s = _equal_rows_tie(x[:, self.columns], self.scores(x, g))
        if self.sample:
            perm = sample_ranking(s, len(pool), self._rng)
        else:
            perm = np.argsort(-s, kind="stable")  # ties: older first
        if self.recorder is None:
            return itertools.chain(forced[:k], (pool[i] for i in perm[: max(k - len(forced), 0)]))
        step = Step(x, g, perm, [j.seq for j in pool])  # every feature: the trainer selects
        if self.teacher is not None:
            step.teacher = self._teacher_order(pool, obs)
        self.recorder.record(step, obs.now)
        return itertools.chain(forced[:k], _counted(pool, perm[: max(k - len(forced), 0)], step))

    def _teacher_order(self, pool: list[QueuedJob], obs: Observation) -> np.ndarray:
        """The teacher's ranking of `pool` (indices): its order of the whole queue,
        restricted to the pool; a job it does not list goes last, older first."""
        assert self.teacher is not None
        at = {j.seq: i for i, j in enumerate(self.teacher.window(len(self._fifo), obs))}
        keys = [at.get(j.seq, len(at) + n) for n, j in enumerate(pool)]
        return np.argsort(np.asarray(keys), kind="stable").astype(np.int64)


def _equal_rows_tie(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """`s` with every row of `x` that equals an earlier one given that row's score.

    Jobs the network cannot tell apart (same kind, submitted in the same second) must
    tie, so that the stable sort puts the older first. A matrix product does not
    promise that: equal rows in different positions of one product may differ in the
    last bit (the kernels block rows), and which of two such jobs went first was then
    an accident of the BLAS kernel, one that changes whole simulations downstream.
    """
    rows = np.ascontiguousarray(x + np.float32(0.0))  # -0.0 == 0.0
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    out: np.ndarray = s[first[inverse]]
    return out


_NO_CAP_NEEDED = ("fifo", "fifo-head")  # scales that bound without max_wait_s
_age = operator.attrgetter("submit_s", "seq")  # (submit, seq): a job's age, older first


def _counted(pool: list[QueuedJob], perm: np.ndarray, step: Step) -> Iterator[QueuedJob]:
    for i in perm:
        step.pulled += 1
        yield pool[i]
