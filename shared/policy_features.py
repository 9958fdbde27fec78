"""The one observation encoder (DESIGN.md, "Prioritisation"): what a learned
policy sees of a window of waiting jobs, as numbers, application-agnostic.

Per job (JOB_FEATURES, one row each):
    log2 GPUs, share of one GPU, allowed types / cluster types, log10 wait (s),
    log10 attained GPU-s, log10 mean run of the same user/VC and GPU count (0 if
    none), has such history, log10 mean run of the user/VC, fits the free GPUs
    now, waiting demand / free GPUs over its allowed types, free / total GPUs of
    its allowed types, fragmentation of its allowed types; then
    waiting demand / total GPUs of its allowed types (per-type load), its GPUs /
    total GPUs of its allowed types, and from history: the run-time estimate
    (same user/VC and GPU count, else the user/VC, else every finished job),
    the bounded slowdown it would have if it started now, (wait + est) /
    max(est, 10 s), its wait relative to the estimate, and its estimated
    GPU-seconds (all log10); then what the drf and sjf-est heuristics know and
    what a mean hides: its VC's GPUs held now / total GPUs and that share's rank
    among the VCs in the window (0 = least served, 1 = most), the rank of its
    estimate in the window (the same scale), and from its group's history the
    number of finished jobs (log10, the estimate's confidence), the mean of
    log10 run times (a geometric mean), the share of runs under 10 minutes
    and the last run (log10);
    then `offload_pressure` (OFFLOAD_FEATURES): the job's offload demand against
    the free bandwidth of its allowed types (shared/offload_signal.py), from an
    observation that offers `offload_pressure(job)` (the simulator's), else 0;
    last, who submitted it and what they asked for (IDENTITY_FEATURES), from jobs
    that had finished only: per user, project and app the number of finished jobs
    (log10), the mean log10 run time of the last few and the mean ratio of run to
    requested time; the requested time (log10) and whether there is one; Tsafrir's
    prediction (the user's last two runs capped by the request); and, for traces
    without identity too, the sweep's siblings of docs/rl-ceiling.md: the mean log10
    run time and the number (log10) of finished jobs of its class (user/VC, GPU
    count) submitted within 30 minutes of it. All 0 where unknown;
    then `fair_share` (FAIR_SHARE_FEATURES): Slurm's fair-share factor of the job's
    queue from the usage decayed with the cluster's half-life (shared/fairshare.py),
    1 where the observation does not offer one;
    last, `f1`'s key in two columns (F1_FEATURES; given `origin_s`, else 0).
Per cluster, a fixed length whatever the GPU types (GLOBAL_FEATURES): free /
total GPUs, waiting demand / total, fragmentation, log10 queue length, log10
mean run of every finished job. `cluster_features` is the per-type variant.

Two columns carry the same number whenever the estimate is 10 s or more
(almost always): `log_est_bsld`, log10 of (wait + est) / max(est, 10 s), and
`log_wait_over_est`, log10(1 + wait / max(est, 10 s)); they differ only for
estimates under 10 s. A redundant input costs the network nothing but a
column; removing it would change the feature list every checkpoint records,
so it stays.

It never reads a run time it should not: its inputs are `QueuedJob` (which has
no run-time field) and `Observation`, whose only run times are `History`'s
(finished jobs). HISTORY_FEATURES are the columns that come from `History`
(what the "without history" ablation drops).
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np

from shared.placement_api import FULL_GPU
from shared.policy_api import History, Observation, QueuedJob

__all__ = [
    "F1_DEFAULT_RUN_S",
    "F1_FEATURES",
    "F1_SUBMIT_WEIGHT",
    "FAIR_SHARE_FEATURES",
    "FEATURE_NEEDS",
    "GLOBAL_FEATURES",
    "HISTORY_FEATURES",
    "IDENTITY_FEATURES",
    "JOB_FEATURES",
    "OFFLOAD_FEATURES",
    "SIBLING_FEATURES",
    "UNICEP_EPS",
    "cluster_features",
    "encode",
    "encode_global",
    "f1_estimate",
    "f1_keys",
    "needs_of",
]

JOB_FEATURES = (
    "log2_gpus", "share", "types_allowed", "log_wait_s", "log_attained_gpu_s",
    "log_mean_run_group_s", "has_group_history", "log_mean_run_who_s", "fits_now",
    "demand_over_free", "free_over_total", "fragmentation",
    "demand_over_total", "gpus_over_total", "log_est_run_s", "log_est_bsld",
    "log_wait_over_est", "log_est_gpu_s",
    "vc_share", "vc_share_rank", "est_rank", "log_group_runs", "group_log_run",
    "group_short_share", "log_last_run_s", "offload_pressure",
    # appended: identity (IDENTITY_FEATURES)
    "log_user_runs", "user_log_run", "user_run_over_req",
    "log_project_runs", "project_log_run", "project_run_over_req",
    "log_app_runs", "app_log_run", "app_run_over_req",
    "log_req_s", "has_req", "log_pred_s", "sibling_log_run", "log_siblings",
    # appended: fair share (FAIR_SHARE_FEATURES)
    "fair_share",
    # appended: f1's key (F1_FEATURES)
    "f1_key", "f1_key_rest",
)  # fmt: skip
OFFLOAD_FEATURES = ("offload_pressure",)  # only in the feature sets that ask for them
# who submitted what and what they asked for, from finished jobs only: only in the
# feature sets that ask for them (the shipped checkpoint reads none)
IDENTITY_FEATURES = JOB_FEATURES[
    JOB_FEATURES.index("log_user_runs") : JOB_FEATURES.index("log_siblings") + 1
]
SIBLING_FEATURES = ("sibling_log_run", "log_siblings")  # within IDENTITY_FEATURES
# the fair-share factor of the job's queue (shared/fairshare.py), from an observation
# that offers `fair_share(vc)` (the simulator's, the scoring service's), else 1: only
# in the feature sets that ask for it (no checkpoint written before it reads it)
FAIR_SHARE_FEATURES = ("fair_share",)
# `f1`'s key (services/scoring/policies/f1.py): log10(max(r, 1)) n + 870 log10(max(s,
# 1)), r its run-time estimate (`f1_estimate`), n the GPUs, s the seconds since the first
# submit the policy saw + 1; computed in float64 as f1 does (`_f1_columns`) and carried
# in two float32 columns, the key rounded and what the rounding left (their float64 sum
# is the key to about 1e-11 of it, so keys further apart never tie or swap). Only computed when
# `encode` is given that origin (a residual network on f1 reads them as its base, not
# as inputs); 0 otherwise. With `encode(..., unicep=True)` (a residual on f1-unicep
# whose rule is on unicep, services/scoring/policies/f1_unicep.py) the two columns
# carry unicep's key instead, in the same order as unicep's score: log10(log2(n +
# 1e-15)) + log10(max(r, 1)) - log10(wait + 1e-15), r the requested time, else f1's
# estimate (`unicep_keys`).
F1_FEATURES = ("f1_key", "f1_key_rest")
F1_SUBMIT_WEIGHT = 870.0
UNICEP_EPS = 1e-15  # added to the wait and the GPUs, as unicep (and RLScheduler) does
F1_DEFAULT_RUN_S = 3600.0
# the trace field an identity feature is computed from: a checkpoint that reads one
# is refused on a trace whose jobs never carry it (`needs_of`)
FEATURE_NEEDS: dict[str, tuple[str, ...]] = {
    **{f"log_{k}_runs": (k,) for k in ("user", "project", "app")},
    **{f"{k}_log_run": (k,) for k in ("user", "project", "app")},
    **{f"{k}_run_over_req": (k, "time_limit_s") for k in ("user", "project", "app")},
    "log_req_s": ("time_limit_s",),
    "has_req": ("time_limit_s",),
}
HISTORY_FEATURES = (
    "log_mean_run_group_s", "has_group_history", "log_mean_run_who_s",
    "log_est_run_s", "log_est_bsld", "log_wait_over_est", "log_est_gpu_s",
    "est_rank", "log_group_runs", "group_log_run", "group_short_share", "log_last_run_s",
)  # fmt: skip
GLOBAL_FEATURES = (
    "free_over_total", "demand_over_total", "fragmentation", "log_queue_length",
    "log_mean_run_all_s",
)  # fmt: skip

BSLD_FLOOR_S = 10.0  # the bounded-slowdown floor of DESIGN.md's avg_bsld


def _log10(x: float | None) -> float:
    return math.log10(1.0 + x) if x else 0.0


def _over_types(types: frozenset[str], obs: Observation) -> tuple[float, float, float, float]:
    """(free, total, waiting demand, fragmentation) over the allowed types (empty: all)."""
    names = sorted(types) if types else [None]
    free = float(sum(obs.free_gpus(t) for t in names))
    total = float(sum(obs.total_gpus(t) for t in names))
    demand = float(sum(obs.waiting_gpus(t) for t in names))
    frag = sum(obs.fragmentation(t) for t in names) / len(names)
    return free, total, demand, frag


def f1_estimate(job: QueuedJob, h: History) -> float:
    """The run time `f1` ranks `job` on: `History.predict` (the user's last two runs
    capped by the request, else the request), else the mean run of its user/VC and GPU
    count, else of its user/VC, else `F1_DEFAULT_RUN_S`. Finished jobs only."""
    guess = h.predict(job.user, job.time_limit_s)
    if guess is not None:
        return guess
    return h.mean_run(job.who, job.num_gpus) or h.mean_run_any(job.who) or F1_DEFAULT_RUN_S


def f1_keys(
    jobs: Sequence[QueuedJob], h: History, origin_s: float, unicep_at: float | None = None
) -> np.ndarray:
    """[n, 2] float64: per job f1's key rounded to float32, and what that left (the
    F1_FEATURES columns): `_f1_columns` with each job's history looked up alone; given
    `unicep_at` (the time of the decision), unicep's key then instead."""
    nan = math.nan
    mean = np.array([h.mean_run(j.who, j.num_gpus) or nan for j in jobs], dtype=np.float64)
    mean_any = np.array([h.mean_run_any(j.who) or nan for j in jobs], dtype=np.float64)
    submit = np.array([j.submit_s for j in jobs], dtype=np.float64)
    return _f1_columns(jobs, h, mean, mean_any, submit, origin_s, unicep_at)


def _f1_columns(
    jobs: Sequence[QueuedJob],
    h: History,
    mean: np.ndarray,
    mean_any: np.ndarray,
    submit: np.ndarray,
    origin_s: float,
    now_s: float | None = None,
) -> np.ndarray:
    """f1's key log10(max(r, 1)) n + 870 log10(max(s, 1)) per job, in float64, as two
    columns (module doc); given `now_s`, unicep's key at that time instead (F1_FEATURES'
    comment). r is `f1_estimate` over the window at once: Tsafrir's
    prediction (each user's last runs looked up once, capped by the request), else the
    request, else `mean` (the job's user/VC and GPU count, NaN or 0: none), else
    `mean_any` (its user/VC), else `F1_DEFAULT_RUN_S`. numpy's log10 may differ from
    math.log10's (f1's) in the last bit, about 1e-16 of the key."""
    n = len(jobs)
    limit = np.fromiter(
        (math.nan if j.time_limit_s is None else j.time_limit_s for j in jobs), np.float64, n
    )
    users = list(map(_USER, jobs))
    by_user = {u: h.predict(u, None) for u in dict.fromkeys(users)}  # last runs' mean
    guess = np.fromiter(
        (math.nan if g is None else g for g in map(by_user.__getitem__, users)), np.float64, n
    )
    asked = ~np.isnan(limit) & (limit != 0)  # `if time_limit_s` in History.predict
    pred = np.where(np.isnan(guess), limit, np.where(asked, np.minimum(guess, limit), guess))
    known = ~np.isnan(mean) & (mean != 0)  # `mean_run(...) or mean_run_any(...) or ...`
    known_any = ~np.isnan(mean_any) & (mean_any != 0)
    fallback = np.where(known, mean, np.where(known_any, mean_any, F1_DEFAULT_RUN_S))
    r = np.where(np.isnan(pred), fallback, pred)
    gpus = np.fromiter(map(_NUM_GPUS, jobs), np.float64, n)
    if now_s is not None:  # unicep's key (F1_FEATURES' comment)
        r_u = np.where(asked, limit, r)
        wait = np.maximum(now_s - submit, 0.0)
        key = (
            np.log10(np.log2(gpus + UNICEP_EPS))
            + np.log10(np.maximum(r_u, 1.0))
            - np.log10(wait + UNICEP_EPS)
        )
    else:
        s = submit - origin_s + 1.0
        key = np.log10(np.maximum(r, 1.0)) * gpus + F1_SUBMIT_WEIGHT * np.log10(np.maximum(s, 1.0))
    head = key.astype(np.float32).astype(np.float64)
    out: np.ndarray = np.stack((head, key - head), axis=1)
    return out


def encode(
    jobs: Sequence[QueuedJob],
    obs: Observation,
    max_jobs: int,
    identity: bool = True,
    origin_s: float | None = None,
    unicep: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(features [max_jobs, len(JOB_FEATURES)] float32, mask [max_jobs] bool), zero-padded.
    `identity=False` leaves the IDENTITY_FEATURES columns 0 (for a policy that reads
    none of them: they are what costs most per job). `origin_s` (the first submit the
    policy saw) fills the F1_FEATURES columns (`f1_keys`); None leaves them 0; with
    `unicep` they carry unicep's key at `obs.now` instead.

    Vectorised over the window: a window's cost is mostly fixed per call, so the
    number of operations, not of jobs, is what to keep small. Every feature but the
    wait, the attained service and the offload pressure is a function of the job's
    kind (user, VC, GPUs, share, allowed types), so it is computed once per distinct
    kind in the window and gathered by index; the rest is a few numpy operations over
    all jobs at once. The features depend on each job and on the set of jobs (the
    ranks), not on their order.
    """
    jobs = jobs[:max_jobs]
    n = len(jobs)
    x = np.zeros((max_jobs, len(JOB_FEATURES)), dtype=np.float32)
    mask = np.zeros(max_jobs, dtype=bool)
    mask[:n] = True
    if not n:
        return x, mask
    kinds_of_jobs = list(map(_KIND_PLAIN, jobs))
    index = {k: i for i, k in enumerate(dict.fromkeys(kinds_of_jobs))}
    kind = list(map(index.__getitem__, kinds_of_jobs))  # each job's kind, by index

    h = obs.history
    everyone = h.mean_run_all()
    n_types = max(len(obs.gpu_types), 1)
    total_gpus = max(obs.total_gpus(), 1)
    users, vcs, n_gpus, millis, typess = zip(*index, strict=True)
    # per kind from history: group mean, who's mean (NaN: none), runs, mean log run,
    # short share, last run
    st = np.array(
        list(map(h.kind_stats, [u or v for u, v in zip(users, vcs, strict=True)], n_gpus)),
        dtype=np.float64,
    )
    mean, mean_any = st[:, 0], st[:, 1]
    has_group, has_any = ~np.isnan(mean), ~np.isnan(mean_any)
    # the estimate: the group's mean, else the who's, else every finished job's
    est = np.where(has_group, mean, mean_any)
    if everyone is not None:
        est = np.where(has_group | has_any, est, everyone)
    has_est = ~np.isnan(est)
    est0 = np.where(has_est, est, 0.0)
    group0 = np.where(has_group, mean, 0.0)
    # per allowed types and per VC, once
    t_index = {t: i for i, t in enumerate(dict.fromkeys(typess))}
    over = np.array(
        [(*_over_types(t, obs), len(t) / n_types if t else 1.0) for t in t_index],
        dtype=np.float64,
    )[list(map(t_index.__getitem__, typess))]
    free, total, demand, frag, allowed = over.T
    v_index = {v: i for i, v in enumerate(dict.fromkeys(vcs))}
    held = np.array([obs.vc_gpus(v) for v in v_index], dtype=np.float64)[
        list(map(v_index.__getitem__, vcs))
    ]
    ng = np.array(n_gpus, dtype=np.float64)
    milli = np.array(millis, dtype=np.float64)
    gpus = ng * milli / 1000.0  # QueuedJob.gpus
    has_total = total > 0
    safe_total = np.where(has_total, total, 1.0)
    per_kind = np.stack(
        (np.log2(ng), milli / FULL_GPU, allowed, has_group, ng <= free,
         demand / np.maximum(free, 1.0), np.where(has_total, free / safe_total, 0.0), frag,
         np.where(has_total, demand / safe_total, 0.0),
         np.where(has_total, gpus / safe_total, 0.0), held / total_gpus, st[:, 3], st[:, 4],
         est0, has_est, _rank(group0), _rank(held)),
        axis=1,
    )  # fmt: skip
    logs = np.log10(1.0 + np.stack(
        (group0, np.where(has_any, mean_any, 0.0), est0, st[:, 2], st[:, 5], est0 * gpus),
        axis=1,
    ))  # fmt: skip
    logs[:, 5] *= has_est  # no estimate (nothing has finished): 0
    ident = _identity_block(jobs, h) if identity else np.zeros((n, len(_NO_IDENTITY)))
    by_kind = np.concatenate((np.concatenate((per_kind, logs), axis=1)[kind], ident), axis=1)

    attained = np.fromiter(map(_ATTAINED, jobs), np.float64, n)
    submit = np.fromiter(map(_SUBMIT, jobs), np.float64, n)
    wait = np.maximum(obs.now - submit, 0.0)
    job_est, job_has_est = by_kind[:, 13], by_kind[:, 14]
    floor = np.maximum(job_est, BSLD_FLOOR_S)
    per_job = np.log10(np.stack(
        (1.0 + wait, 1.0 + attained, np.maximum((wait + job_est) / floor, 1.0),
         1.0 + wait / floor),
        axis=1,
    ))  # fmt: skip
    per_job[:, 2:] *= job_has_est[:, None]
    pressure = getattr(obs, "offload_pressure", None)
    offload = np.fromiter(map(pressure, jobs), np.float64, n) if pressure else np.zeros(n)
    sibs = _siblings(h, kinds_of_jobs, submit) if identity else np.zeros((n, 2))
    share = np.ones(n)
    fair = getattr(obs, "fair_share", None)
    if fair is not None:
        of_vc = {vc: fair(vc) for vc in {j.vc for j in jobs}}  # per VC, once
        share = np.fromiter((of_vc[j.vc] for j in jobs), np.float64, n)
    if origin_s is None:
        f1 = np.zeros((n, 2))
    else:
        now_s = obs.now if unicep else None
        f1 = _f1_columns(jobs, h, mean[kind], mean_any[kind], submit, origin_s, now_s)
    cols = (by_kind, per_job, offload[:, None], sibs, share[:, None], f1)
    x[:n] = np.concatenate(cols, axis=1)[:, _ORDER]
    return x, mask


_NO_IDENTITY = (0.0,) * 12
_NAME_GETTERS = tuple((f, operator.attrgetter(f)) for f in ("user", "project", "app"))


def _identity_block(jobs: Sequence[QueuedJob], h: History) -> np.ndarray:
    """The IDENTITY_FEATURES of `jobs` [n, 12] but the siblings' (per job), in
    `_BLOCKS` order: per user, project and app the finished jobs (log10(1 + count)),
    the mean log10(1 + run s) of the last few and the mean run / requested time (0
    where unknown); the request (log10(1 + s)), whether there is one, and Tsafrir's
    prediction (`History.predict`, log10(1 + s); 0 if none). Finished jobs only.

    Looked up once per distinct name (and user's prediction) and gathered by index,
    so a window of many kinds costs a few calls per name, not per job."""
    n = len(jobs)
    out = np.zeros((n, 12))
    for block, (field, getter) in enumerate(_NAME_GETTERS):
        names = list(map(getter, jobs))
        index = {k: i for i, k in enumerate(dict.fromkeys(names))}
        per_name = np.zeros((len(index), 3))
        for i, name in enumerate(index):
            st = h.identity_stats(field, name)
            if st is not None:
                per_name[i] = st
        if per_name.any():
            per_name[:, 0] = np.log10(1.0 + per_name[:, 0])
            np.maximum(per_name[:, 2], 0.0, out=per_name[:, 2])
            out[:, 3 * block : 3 * block + 3] = per_name[list(map(index.__getitem__, names))]
    limit = np.fromiter((j.time_limit_s or 0.0 for j in jobs), np.float64, n)
    users = list(map(_USER, jobs))
    # the mean of each user's last runs, or None
    by_user = {u: h.predict(u, None) for u in dict.fromkeys(users)}
    guess = np.fromiter((math.nan if g is None else g for g in map(by_user.__getitem__, users)),
                        np.float64, n)  # fmt: skip
    known = ~np.isnan(guess)
    # `History.predict(user, limit)`: the guess capped by the request, else the request
    pred = np.where(known, np.where(limit > 0, np.minimum(guess, limit), guess), limit)
    out[:, 9] = np.log10(1.0 + limit)
    out[:, 10] = limit > 0
    out[:, 11] = np.log10(1.0 + np.where(np.isnan(pred), 0.0, pred))
    return out


def _siblings(
    h: History, kinds: Sequence[tuple[str, str, int, int, frozenset[str]]], submit: np.ndarray
) -> np.ndarray:
    """[n, 2]: per job (mean log10(1 + run s), log10(1 + count)) of its finished
    siblings, its class's jobs submitted within `History.SIBLING_S` of it (0, 0 if
    none): `History.siblings`, with each class's runs looked up once per window."""
    span = h.SIBLING_S
    tables: dict[tuple[str, int], tuple[list[float], list[float]] | None] = {}
    fsum, log10, none = math.fsum, math.log10, (0.0, 0.0)
    rows: list[tuple[float, float]] = []
    for (user, vc, gpus, _, _), at in zip(kinds, submit.tolist(), strict=True):
        key = (user or vc, gpus)  # QueuedJob.who
        if key in tables:
            found = tables[key]
        else:
            found = tables[key] = h.sibling_runs(*key)
        if found is None:
            rows.append(none)
            continue
        subs, logs = found
        lo = bisect_left(subs, at - span)
        hi = bisect_right(subs, at + span)
        rows.append((fsum(logs[lo:hi]) / (hi - lo), log10(1.0 + (hi - lo))) if hi > lo else none)
    return np.array(rows, dtype=np.float64).reshape(len(rows), 2)


def needs_of(features: Sequence[str]) -> tuple[str, ...]:
    """The trace fields (TraceJob / JobSpec names) that `features` are computed from."""
    return tuple(dict.fromkeys(n for f in features for n in FEATURE_NEEDS.get(f, ())))


# what a job's features but its wait, service, siblings and offload pressure are a
# function of
_KIND_PLAIN = operator.attrgetter("user", "vc", "num_gpus", "gpu_milli", "gpu_types")
# what its identity features but the siblings' are a function of
_USER = operator.attrgetter("user")
_ATTAINED = operator.attrgetter("attained_gpu_s")
_NUM_GPUS = operator.attrgetter("num_gpus")
_SUBMIT = operator.attrgetter("submit_s")
# where each JOB_FEATURES column is in what `encode` concatenates ("-": only used there)
_BLOCKS = (
    # per kind, plain
    "log2_gpus", "share", "types_allowed", "has_group_history", "fits_now",
    "demand_over_free", "free_over_total", "fragmentation", "demand_over_total",
    "gpus_over_total", "vc_share", "group_log_run", "group_short_share", "-est",
    "-has_est", "est_rank", "vc_share_rank",
    # per kind, log10(1 + x)
    "log_mean_run_group_s", "log_mean_run_who_s", "log_est_run_s", "log_group_runs",
    "log_last_run_s", "log_est_gpu_s",
    # identity but the siblings (`_identity_block`)
    "log_user_runs", "user_log_run", "user_run_over_req",
    "log_project_runs", "project_log_run", "project_run_over_req",
    "log_app_runs", "app_log_run", "app_run_over_req", "log_req_s", "has_req", "log_pred_s",
    # per job
    "log_wait_s", "log_attained_gpu_s", "log_est_bsld", "log_wait_over_est", "offload_pressure",
    "sibling_log_run", "log_siblings", "fair_share", "f1_key", "f1_key_rest",
)  # fmt: skip
_ORDER = np.array([_BLOCKS.index(f) for f in JOB_FEATURES], dtype=np.intp)


def _rank(v: np.ndarray) -> np.ndarray:
    """Dense rank of each value among the distinct values, scaled to [0, 1] (all equal:
    0): it depends on the set of values, not their order. No NaN."""
    distinct, rank = np.unique(v, return_inverse=True)
    out: np.ndarray = rank / max(len(distinct) - 1, 1)
    return out


def encode_global(obs: Observation) -> np.ndarray:
    """The GLOBAL_FEATURES of `obs`: the same length on every cluster."""
    total = max(obs.total_gpus(), 1)
    return np.asarray(
        (
            obs.free_gpus() / total,
            obs.waiting_gpus() / total,
            obs.fragmentation(),
            _log10(obs.queue_length()),
            _log10(obs.history.mean_run_all()),
        ),
        dtype=np.float32,
    )


def cluster_features(obs: Observation) -> np.ndarray:
    out: list[float] = []
    for t in obs.gpu_types:
        total = max(obs.total_gpus(t), 1)
        out += [obs.free_gpus(t) / total, obs.waiting_gpus(t) / total, obs.fragmentation(t)]
    out.append(obs.queue_length() / 1000.0)
    return np.asarray(out, dtype=np.float32)
