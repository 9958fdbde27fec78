"""The interface between whoever keeps the waiting queue (the simulator, the
scoring service) and a prioritisation policy (DESIGN.md, "Prioritisation").

A policy keeps its own index of the waiting jobs, told of every job that joins
(`add`) or leaves (`remove`) the queue, and answers `window(k, obs)`: the first
`k` waiting jobs in its priority order, most urgent first. Everything a policy
may know is here, and it is application-agnostic: what a job requests (GPUs,
share, allowed types), how long it has waited and been served, what its user
and VC did before (`History`, learned online from finished jobs) and what the
cluster looks like (`Observation`: free and total GPUs and waiting demand per
type, fragmentation, GPUs held per VC). A job's true run time is not among them:
only a policy that declares `oracle = True` is handed one, in an `OracleContext`
(every other policy gets a `PolicyContext`, which has no such field).

A learned policy implements the same protocol: keep the jobs in arrival order,
encode the first N (features from `QueuedJob` + `Observation`), score them and
return the top `k` by score (`shared.policy_features.encode`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from shared.cluster import ClusterSpec

__all__ = [
    "IDENTITY_FIELDS",
    "History",
    "Observation",
    "OracleContext",
    "Policy",
    "PolicyContext",
    "QueuedJob",
    "policy_context",
]


IDENTITY_FIELDS = ("user", "project", "app")  # who submitted what (JobSpec)


@dataclass(slots=True, eq=False)
class QueuedJob:
    """A job as a policy sees it (never its true run time)."""

    seq: int  # position in submit order: the final tie-break everywhere
    job_id: str
    submit_s: float
    num_gpus: int
    gpu_milli: int = 1000
    gpu_types: frozenset[str] = frozenset()  # allowed types (cluster names); empty = any
    user: str = ""
    vc: str = ""
    weight: float = 1.0
    attained_gpu_s: float = 0.0  # GPU-seconds of service received so far (preempted jobs)
    runs: int = 0  # how many times it has started
    project: str = ""  # group / account (JobSpec.project)
    app: str = ""  # executable or job name (JobSpec.app)
    time_limit_s: float | None = None  # requested wall time; None: not given

    @property
    def who(self) -> str:
        """The user if the trace names one, else the VC: whose history to learn from."""
        return self.user or self.vc

    @property
    def gpus(self) -> float:
        """GPUs requested, counting a share as its fraction of one GPU."""
        return self.num_gpus * self.gpu_milli / 1000.0


@dataclass(slots=True)
class _IdentityRuns:
    """The finished jobs of one user, project or app: what `identity_stats` reads."""

    count: int = 0
    recent: list[float] = field(default_factory=list)  # log10(1 + run s), newest last
    ratio_sum: float = 0.0  # sum of run / requested time, over jobs that requested one
    ratio_count: int = 0


class History:
    """Run times of finished jobs, learned online (running means), and per (user or
    VC, GPU count) group what a mean hides: the mean of log run times (a geometric
    mean, which a few month-long jobs do not drag up), the share of runs under
    `SHORT_S`, and the last run (users resubmit the same job).

    Where a trace names who submitted (user, project, app), it also keeps per name the
    statistics the identity features read (`identity_stats`), and per user the last
    two run times, for Tsafrir et al.'s system-generated predictions (`predict`)."""

    __slots__ = ("_all", "_group", "_ident", "_last", "_sibs", "_who")

    DEFAULT_RUN_S = 3600.0  # the estimate before anything has finished
    SHORT_S = 600.0  # a "short" run, for `short_share`
    RECENT = 5  # runs in an identity's recent log-mean
    SIBLING_S = 1800.0  # siblings: same-class jobs submitted within this of a job
    # finished jobs kept per class for `siblings`, the earliest submitted dropped first:
    # memory stays bounded in a scoring service that runs for months
    SIBLINGS_KEPT = 4096

    def __init__(self) -> None:
        # (who, gpus) -> [sum, count, sum of log10(1 + run), runs < SHORT_S, last run]
        self._group: dict[tuple[str, int], list[float]] = {}
        self._who: dict[str, list[float]] = {}
        self._all = [0.0, 0.0]  # every finished job: [sum, count]
        self._last: dict[str, list[float]] = {}  # user -> its last two runs, newest last
        self._ident: dict[tuple[str, str], _IdentityRuns] = {}  # (field, name) -> runs
        # (who, gpus) -> (submit times sorted, log10(1 + run) in the same order)
        self._sibs: dict[tuple[str, int], tuple[list[float], list[float]]] = {}

    def record(self, job: QueuedJob, run_s: float) -> None:
        """`job` finished after holding its GPUs for `run_s` seconds."""
        acc = self._group.setdefault((job.who, job.num_gpus), [0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += run_s
        acc[1] += 1.0
        acc[2] += math.log10(1.0 + run_s)
        acc[3] += run_s < self.SHORT_S
        acc[4] = run_s
        acc = self._who.setdefault(job.who, [0.0, 0.0])
        acc[0] += run_s
        acc[1] += 1.0
        self._all[0] += run_s
        self._all[1] += 1.0
        if job.user:
            last = self._last.setdefault(job.user, [])
            last.append(run_s)
            if len(last) > 2:
                del last[0]
        log_run = math.log10(1.0 + run_s)
        subs, logs = self._sibs.setdefault((job.who, job.num_gpus), ([], []))
        at = bisect_right(subs, job.submit_s)
        subs.insert(at, job.submit_s)
        logs.insert(at, log_run)
        if len(subs) > self.SIBLINGS_KEPT:  # bounded in a long-running service
            del subs[0], logs[0]
        limit = job.time_limit_s
        for name in IDENTITY_FIELDS:
            value = getattr(job, name)
            if not value:
                continue
            st = self._ident.get((name, value))
            if st is None:
                st = self._ident[(name, value)] = _IdentityRuns()
            st.count += 1
            st.recent.append(log_run)
            if len(st.recent) > self.RECENT:
                del st.recent[0]
            if limit:
                st.ratio_sum += run_s / limit
                st.ratio_count += 1

    def mean_run(self, who: str, num_gpus: int) -> float | None:
        """Mean run time of `who`'s finished jobs of `num_gpus` GPUs; None if there are none."""
        acc = self._group.get((who, num_gpus))
        return acc[0] / acc[1] if acc else None

    def group_stats(self, who: str, num_gpus: int) -> tuple[float, float, float, float] | None:
        """(finished jobs, mean log10(1 + run s), share of runs < SHORT_S, last run s) of
        `who`'s jobs of `num_gpus` GPUs; None if none has finished."""
        acc = self._group.get((who, num_gpus))
        if not acc:
            return None
        return acc[1], acc[2] / acc[1], acc[3] / acc[1], acc[4]

    def kind_stats(
        self, who: str, num_gpus: int
    ) -> tuple[float, float, float, float, float, float]:
        """(`mean_run`, `mean_run_any`, then `group_stats` or four 0s) in one look-up, NaN
        where `mean_run` or `mean_run_any` is None: for an encoder that reads all of them
        for many kinds of job at once."""
        acc = self._group.get((who, num_gpus))
        any_ = self._who.get(who)
        mean_any = any_[0] / any_[1] if any_ else math.nan
        if not acc:
            return math.nan, mean_any, 0.0, 0.0, 0.0, 0.0
        n = acc[1]
        return acc[0] / n, mean_any, n, acc[2] / n, acc[3] / n, acc[4]

    def mean_run_any(self, who: str) -> float | None:
        """Mean run time of all of `who`'s finished jobs; None if there are none."""
        acc = self._who.get(who)
        return acc[0] / acc[1] if acc else None

    def mean_run_all(self) -> float | None:
        """Mean run time of every finished job; None if none has finished."""
        return self._all[0] / self._all[1] if self._all[1] else None

    def predict(self, user: str, time_limit_s: float | None) -> float | None:
        """The run time Tsafrir, Etsion and Feitelson's system-generated predictions
        (IEEE TPDS 2007) give a job of `user` that requests `time_limit_s`: the mean of
        the user's last two finished jobs' run times (the last one's while only one has
        finished), capped by the request; the request itself while the user has no
        finished job (or the trace names no user); None when there is neither."""
        last = self._last.get(user) if user else None
        if last:
            guess = sum(last) / len(last)
            return min(guess, time_limit_s) if time_limit_s else guess
        return time_limit_s

    def estimate(self, job: QueuedJob) -> float:
        """A run-time estimate for `job` from what is known when it is decided: `predict`
        (the user's last two runs capped by the request, else the request), else the
        mean of its user's (or VC's) finished jobs of the same size, else of all their
        jobs, else of every finished job, else `DEFAULT_RUN_S`. What EASY backfill
        reserves with, and what `sjf-est` and `f1` order by."""
        guess = self.predict(job.user, job.time_limit_s)
        if guess is not None:
            return guess
        acc = self._group.get((job.who, job.num_gpus)) or self._who.get(job.who)
        if acc:
            return acc[0] / acc[1]
        if self._all[1]:
            return self._all[0] / self._all[1]
        return self.DEFAULT_RUN_S

    def identity_stats(self, field: str, name: str) -> tuple[float, float, float] | None:
        """(finished jobs, mean log10(1 + run s) of the last `RECENT`, mean of run /
        requested time over those that requested one, or -1 if none did) of the jobs
        whose `field` (user, project or app) is `name`; None if none has finished."""
        st = self._ident.get((field, name)) if name else None
        if st is None:
            return None
        ratio = st.ratio_sum / st.ratio_count if st.ratio_count else -1.0
        return float(st.count), sum(st.recent) / len(st.recent), ratio

    def siblings(self, who: str, num_gpus: int, submit_s: float) -> tuple[int, float] | None:
        """(how many, mean log10(1 + run s)) of the finished jobs of `who` with
        `num_gpus` GPUs submitted within `SIBLING_S` of `submit_s` (a sweep's
        siblings, docs/rl-ceiling.md); None if none has finished."""
        found = self._sibs.get((who, num_gpus))
        if found is None:
            return None
        subs, logs = found
        lo = bisect_left(subs, submit_s - self.SIBLING_S)
        hi = bisect_right(subs, submit_s + self.SIBLING_S)
        if hi <= lo:
            return None
        return hi - lo, math.fsum(logs[lo:hi]) / (hi - lo)

    def sibling_runs(self, who: str, num_gpus: int) -> tuple[list[float], list[float]] | None:
        """(submit times sorted, log10(1 + run s) in the same order) of the finished jobs
        of `who` with `num_gpus` GPUs, what `siblings` searches (read only); None if none
        has finished. For an encoder that searches one class for many jobs."""
        return self._sibs.get((who, num_gpus))

    def finished(self, who: str) -> int:
        acc = self._who.get(who)
        return int(acc[1]) if acc else 0


class Observation(Protocol):
    """The cluster and queue as a policy may see them at one round."""

    now: float
    history: History

    @property
    def gpu_types(self) -> tuple[str, ...]: ...

    def total_gpus(self, gpu_type: str | None = None) -> int: ...

    def free_gpus(self, gpu_type: str | None = None) -> int:
        """Whole GPUs free (of one type, or all)."""
        ...

    def waiting_gpus(self, gpu_type: str | None = None) -> float:
        """GPUs asked for by waiting jobs that may run on `gpu_type` (None: all waiting)."""
        ...

    def fragmentation(self, gpu_type: str | None = None) -> float:
        """Share of the free whole GPUs that sit on partly used nodes (0 = none, 1 = all)."""
        ...

    def vc_gpus(self, vc: str) -> float:
        """GPUs held now by the running jobs of `vc`."""
        ...

    def queue_length(self) -> int: ...


@dataclass(frozen=True)
class PolicyContext:
    """What a policy is given at the start of a run: never a job's true run time."""

    cluster: ClusterSpec
    history: History
    seed: int = 0
    options: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class OracleContext(PolicyContext):
    """A PolicyContext with the jobs' true run times, handed only to a policy that
    declares `oracle = True` (shown as "(oracle)" wherever it is reported)."""

    true_run_s: Callable[[QueuedJob], float] = field(kw_only=True)


def policy_context(
    policy: Policy,
    cluster: ClusterSpec,
    history: History,
    seed: int = 0,
    true_run_s: Callable[[QueuedJob], float] | None = None,
) -> PolicyContext:
    """The context `policy` may have: with `true_run_s` only if it is an oracle."""
    if getattr(policy, "oracle", False) and true_run_s is not None:
        return OracleContext(cluster, history, seed, true_run_s=true_run_s)
    return PolicyContext(cluster, history, seed)


class Policy(Protocol):
    """Decides which waiting job goes next. Same object in simulation and in service."""

    name: str
    oracle: bool  # reads true run times (PolicyContext.true_run_s)
    time_invariant: bool  # the order of two waiting jobs changes only when a job finishes

    @property
    def label(self) -> str:
        """How results are shown: the name, with "(oracle)" when `oracle`."""
        ...

    def reset(self, ctx: PolicyContext) -> None:
        """Forget every job: a new run on `ctx.cluster` starts."""
        ...

    def add(self, job: QueuedJob) -> None:
        """`job` joined the waiting queue (it arrived, or was preempted)."""
        ...

    def remove(self, job: QueuedJob) -> None:
        """`job` left the waiting queue (it started)."""
        ...

    def window(self, k: int, obs: Observation) -> Iterable[QueuedJob]:
        """The first `k` waiting jobs in priority order, most urgent first.

        The caller may stop reading early (the simulator does once nothing more can
        fit), so an iterator that computes lazily is the cheap way to answer.
        """
        ...
