"""The arguments of `rltune train` (`Args`, one docstring per field, CleanRL
style), importable without torch so the command line stays quick to start."""

from __future__ import annotations

import ast
import inspect
import itertools
from dataclasses import dataclass

from shared.errors import UserError
from shared.policy_features import (
    F1_FEATURES,
    FAIR_SHARE_FEATURES,
    HISTORY_FEATURES,
    IDENTITY_FEATURES,
    JOB_FEATURES,
    OFFLOAD_FEATURES,
    SIBLING_FEATURES,
)
from shared.traces._io import parse_time

__all__ = [
    "ARG_DOCS",
    "BOUND_SCALES",
    "FEATURE_SETS",
    "HEURISTICS",
    "OBJECTIVES",
    "POLICY_TEACHERS",
    "RESIDUALS",
    "REWARDS",
    "TEACHERS",
    "VAL_SCORES",
    "Args",
    "validate",
    "when",
]

OBJECTIVES = ("bsld", "queue", "jct", "util")
RESIDUALS = ("drf", "f1", "f1-unicep")  # network.BASES (that module imports torch)
REWARDS = ("episode", "round")
VAL_SCORES = ("mean", "geo")  # see Args.val_score
BOUND_SCALES = ("fixed", "backlog", "fifo", "fifo-head")  # see Args.bound_scale

# only in the feature sets that ask for them (F1_FEATURES: only a residual on f1)
_OPTIONAL = OFFLOAD_FEATURES + IDENTITY_FEATURES + FAIR_SHARE_FEATURES + F1_FEATURES
_BASE = tuple(f for f in JOB_FEATURES if f not in _OPTIONAL)
FEATURE_SETS = {
    "all": _BASE,  # every feature but the offload, identity and fair-share ones
    "no-history": tuple(f for f in _BASE if f not in HISTORY_FEATURES),
    "offload": _BASE + OFFLOAD_FEATURES,  # all, and the job's offload pressure
    "identity": _BASE + IDENTITY_FEATURES,  # all, and who submitted what (causal)
    # the ablation: identity without the siblings' two columns
    "identity-no-siblings": _BASE
    + tuple(f for f in IDENTITY_FEATURES if f not in SIBLING_FEATURES),
    "fair-share": _BASE + FAIR_SHARE_FEATURES,  # all, and the queue's fair-share factor
}
# none knows run times; `las` is `fifo` without preemption, so it is not run twice
HEURISTICS = ("fifo", "sjf-est", "f1", "wfp3", "unicep", "f1-unicep", "multifactor", "smallest",
              "drf")  # fmt: skip
# rankings the warm start can imitate; the last two read true run times (privileged:
# the trainer has them, the network's inputs never do)
TEACHERS = ("sjf-est", "drf", "drf-sjf", "sjf-oracle", "drf-oracle")
# heuristics the warm start can imitate by running them beside the network (every
# round ranked by the policy object itself; env.EpisodeConfig.teacher)
POLICY_TEACHERS = ("fifo", "sjf-est", "sjf-req", "f1", "wfp3", "unicep", "f1-unicep",
                   "multifactor", "smallest", "drf")  # fmt: skip


@dataclass
class Args:
    trace: str = ""
    """the trace to train on"""
    format: str = "philly"
    """its format (as `rltune simulate --format`)"""
    clusters: tuple[str, ...] = ()
    """cluster files; each episode runs on one of them, drawn at random"""
    world: str = ""
    """a world file (YAML: traces, formats, clusters, training and validation parts;
    services/scoring/rl/world.py) to train across instead of --trace/--cluster"""
    until: str = ""
    """train on jobs submitted before this time (UTC date or trace seconds); empty: all"""
    val_from: str = ""
    """validation jobs: submitted from this time up to `until`, never trained on"""
    out: str = "models/rl.pt"
    """the checkpoint to write (the best by validation score)"""
    resume: str = ""
    """continue from this checkpoint (its `.last` file holds the optimizer)"""
    seed: int = 1
    """seed of every random choice"""
    iterations: int = 40
    """PPO iterations (rollouts + update)"""
    episodes: int = 16
    """episodes per iteration"""
    workers: int = 2
    """rollout processes (0: in this process)"""
    time_budget_s: float = 0.0
    """stop after this many seconds of training (0: no limit)"""
    prefix: int = 256
    """jobs replayed under the baseline before the policy takes over"""
    jobs: int = 256
    """jobs per episode whose rounds the policy decides"""
    load_lo: float = 0.8
    """lowest demand / capacity of an episode"""
    load_hi: float = 1.2
    """highest demand / capacity of an episode"""
    baseline: str = "drf"
    """the heuristic of the prefix and of the reward"""
    teacher: str = "drf"
    """the ranking the warm start imitates: sjf-est, drf, drf-sjf, or the privileged
    sjf-oracle / drf-oracle (true run times, seen by the trainer only), read off the
    features; or a heuristic run beside the network (f1, wfp3, ...), or best:f1,wfp3,...
    (per episode the one of those whose own run of it is best)"""
    objective: str = "bsld"
    """what the reward improves: bsld, queue, jct or util"""
    reward: str = "episode"
    """credit: episode (the gain on the last round) or round (split over the rounds
    by when each job started; same sum; util stays per episode)"""
    placer: str = "greedy"
    """placement in the loop"""
    window: int = 128
    """jobs the policy ranks per round"""
    max_wait_h: float = 0.0
    """wait bound: a job of --bound-gpus or more waiting this many hours goes ahead of
    the network's ranking, oldest first (aging); stored in the checkpoint and applied
    when it serves, not in training episodes (0: none; under --bound-scale fifo: no cap)"""
    bound_gpus: int = 16
    """the smallest job (GPUs) the wait bound applies to"""
    bound_scale: str = "fixed"
    """fixed: the bound is --max-wait-h; backlog: --max-wait-h x (1 + GPUs asked by
    waiting jobs / the cluster's GPUs) at each round, later the fuller the queue; fifo: when
    the job's turn comes in EASY fifo over run times estimated from history (it would be
    the head or have started), or after --max-wait-h if given, whichever is first;
    fifo-head: when it is the oldest waiting job (or after --max-wait-h if given)"""
    features: str = "all"
    """feature set: all, no-history (the ablation), offload (all + offload_pressure), or
    identity (all + user/project/app history, requested time, siblings)"""
    hidden: int = 32
    """width of the network"""
    context: bool = True
    """score each job with the window's pooled summary (False: the plain kernel)"""
    residual: str = ""
    """drf, f1 or f1-unicep: the network learns a correction added to that heuristic's
    score, starting at zero, so that the untrained policy is the heuristic (residual
    policy learning; f1 and f1-unicep add the columns of their key to the features);
    empty: none"""
    residual_bound: float = 0.0
    """> 0: the residual's correction is kept within this (c * tanh(out / c)): a job
    of one VC passes another only if it waited at least 10^-2c as long (0: unbounded)"""
    residual_scale: float = 1.0
    """f1's key is scaled by this in the residual's score (network.py): two jobs whose
    keys differ by d are sampled in f1's order with odds e^(scale d) : 1"""
    shuffle_ties: bool = False
    """each episode orders the jobs submitted in one second at random (seeded by the
    episode), so the policy cannot learn one order of arbitrary ties"""
    fill_load: bool = False
    """an episode whose prefix + jobs jobs cannot reach its load even with their
    arrivals compressed (Philly's 512 reach 0.2-0.4 of its 640 GPUs) takes twice as
    many jobs, and again, up to 8 times as many, until they can (env.py)"""
    keep_every: int = 0
    """also keep the checkpoint of every this many iterations (`out` + `.itN`), for
    selection on whole simulations afterwards (0: none)"""
    warm_start: int = 10
    """epochs imitating the teacher's ranking per warm-start iteration (0: none)"""
    warm_iterations: int = 1
    """iterations spent imitating the teacher (on the states the policy visits) before PPO"""
    learning_rate: float = 3e-4
    """Adam's learning rate"""
    warm_learning_rate: float = 3e-3
    """Adam's learning rate while imitating the teacher (the warm start)"""
    gamma: float = 1.0
    """discount (episodes are finite)"""
    gae_lambda: float = 0.95
    """GAE's lambda"""
    update_epochs: int = 4
    """passes over each iteration's steps"""
    minibatch_steps: int = 256
    """steps per minibatch"""
    clip_coef: float = 0.2
    """PPO's ratio clip"""
    clip_vloss: bool = True
    """clip the value loss too"""
    ent_coef: float = 0.01
    """entropy bonus"""
    vf_coef: float = 0.5
    """value-loss weight"""
    max_grad_norm: float = 0.5
    """gradient-norm clip"""
    target_kl: float = 0.03
    """stop an update early past this approximate KL (0: never)"""
    val_every: int = 5
    """iterations between validations"""
    val_episodes: int = 6
    """validation episodes"""
    val_score: str = "mean"
    """how validation scores a checkpoint against each episode's best heuristic: mean
    (the mean relative gain, (best - policy) / best, unbounded below, so one bad
    episode outweighs many good ones) or geo (1 - the geometric mean of policy /
    best, the statistic the matrix reports); 0 is as good as the best everywhere"""
    log: str = ""
    """CSV of every iteration's scalars (default: `out` with .csv)"""
    offload_fraction: float = 0.0
    """mark this seeded share of the jobs as offloading (sizes as `simulate`; 0: none)"""
    share_fraction: float = 0.0
    """make this seeded share of the whole one-GPU jobs GPU shares of 1/4, 1/2 or 3/4
    of a GPU (shared/sim/share_jobs.py; 0: none)"""
    offload_reward: float = 0.0
    """weight of the reward's offload part (shared/offload_signal.py) against the
    objective's gain: + W x (part under the policy - part under the baseline)"""


def _arg_docs() -> dict[str, str]:
    """Each Args field's one-line docstring (the string under it), for --help."""
    tree = ast.parse(inspect.getsource(Args))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for a, b in itertools.pairwise(body):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr):
            docs[a.target.id] = str(b.value.value)  # type: ignore[attr-defined, union-attr]
    return docs


ARG_DOCS = _arg_docs()


def validate(args: Args) -> None:
    """UserError (one line) for the first argument that cannot work."""
    if bool(args.world) == bool(args.trace):
        raise UserError("give either --trace (with --cluster) or --world FILE, not both")
    if args.objective not in OBJECTIVES:
        raise UserError(f"--objective {args.objective!r}: choose from {', '.join(OBJECTIVES)}")
    if args.reward not in REWARDS:
        raise UserError(f"--reward {args.reward!r}: choose from {', '.join(REWARDS)}")
    if args.teacher not in TEACHERS:
        names = args.teacher.removeprefix("best:").split(",")
        bad = [n for n in names if n not in POLICY_TEACHERS]
        if bad:
            raise UserError(
                f"--teacher {args.teacher!r}: choose from {', '.join(TEACHERS)}, a heuristic "
                f"({', '.join(POLICY_TEACHERS)}) or best:NAME,NAME,... of those"
            )
    if args.bound_scale not in BOUND_SCALES:
        raise UserError(
            f"--bound-scale {args.bound_scale!r}: choose from {', '.join(BOUND_SCALES)}"
        )
    if args.residual not in ("", *RESIDUALS):
        raise UserError(f"--residual {args.residual!r}: choose from {', '.join(RESIDUALS)}")
    if args.residual_bound < 0:
        raise UserError("--residual-bound must be 0 or more")
    if args.val_score not in VAL_SCORES:
        raise UserError(f"--val-score {args.val_score!r}: choose from {', '.join(VAL_SCORES)}")
    if args.residual_scale <= 0:
        raise UserError("--residual-scale must be above 0")
    if args.keep_every < 0:
        raise UserError("--keep-every must be 0 or more")
    if args.features not in FEATURE_SETS:
        raise UserError(f"--features {args.features!r}: choose from {', '.join(FEATURE_SETS)}")
    for name in (
        "iterations", "episodes", "prefix", "jobs", "window", "minibatch_steps", "bound_gpus"
    ):  # fmt: skip
        if getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive")
    if args.workers < 0:
        raise UserError("--workers must be 0 or more")
    if args.max_wait_h < 0:
        raise UserError("--max-wait-h must be 0 or more")
    if not 0.0 <= args.offload_fraction <= 1.0:
        raise UserError("--offload-fraction must be between 0 and 1")
    if not 0.0 <= args.share_fraction <= 1.0:
        raise UserError("--share-fraction must be between 0 and 1")
    if args.offload_reward < 0:
        raise UserError("--offload-reward must be 0 or more")
    if not 0 < args.load_lo <= args.load_hi:
        raise UserError("--load-lo must be positive and at most --load-hi")
    when(args.until)
    when(args.val_from)


def when(text: str) -> float | None:
    """Seconds from a UTC date (YYYY-MM-DD[ HH:MM:SS]) or a number; None if empty."""
    if not text:
        return None
    try:
        return parse_time(
            text if any(c in text for c in " T") or "-" not in text else text + " 00:00:00"
        )
    except ValueError:
        raise UserError(f"cannot read time {text!r}: give YYYY-MM-DD or seconds") from None
