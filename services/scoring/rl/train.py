"""PPO for the ranking policy, laid out like CleanRL's ppo.py: the arguments,
storage, then one loop of rollout -> advantages -> clipped updates -> logging.

Every iteration draws `episodes` episodes (cluster shape, trace position, load
and seed, from the run's seed and the iteration number: a resumed run draws the
same ones), runs them on the rollout workers, and updates the network on the
rounds they recorded. Every `val_every` iterations the greedy policy runs the
validation episodes (jobs never trained on) and is compared with the best
heuristic on them; the checkpoint with the best validation score is `out`,
the latest one (with optimizer state, for `--resume`) is `out` + `.last`.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.scoring.rl.args import (
    FEATURE_SETS,
    HEURISTICS,
    TEACHERS,
    Args,
    validate,
    when,
)
from services.scoring.rl.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from services.scoring.rl.env import (
    EpisodeConfig,
    EpisodeResult,
    EpisodeSpec,
    relative_gain,
)
from services.scoring.rl.network import KEY_BASES, NetConfig, ScoreNet
from services.scoring.rl.ppo import (
    clipped_policy_loss,
    gae,
    masked_entropy,
    pl_log_prob,
    value_loss,
)
from services.scoring.rl.rollout import Batch, Rollouts, Worlds, make_batch
from services.scoring.rl.validation import validation_set
from services.scoring.rl.world import World, load_world_file
from shared.cluster import load_cluster
from shared.errors import UserError
from shared.policy_features import F1_FEATURES, GLOBAL_FEATURES, needs_of
from shared.sim import load_jobs
from shared.sim.offload_jobs import describe_marking, mark_offloading
from shared.sim.share_jobs import describe_shares, mark_shares
from shared.traces import SkipStats, TraceJob

__all__ = [
    "FEATURE_SETS",
    "Args",
    "IterationLog",
    "load_world",
    "make_optimizer",
    "net_config",
    "train",
    "world_needs",
]

LOSSES = ("policy", "value", "entropy", "kl", "clip", "warm_start")


@dataclass
class IterationLog:
    iteration: int
    steps: int
    reward: float
    update_s: float
    rollout_s: float
    decisions: int
    jobs: int
    losses: dict[str, float]
    val_gain: float | None


def load_world(args: Args) -> tuple[World, World]:
    """(training worlds, validation worlds): with `--world FILE` the file's parts
    (world.py); else the one trace on each `--cluster`, split by `--until` and
    `--val-from`."""
    if args.world:
        tw, vw = load_world_file(args.world, "train"), load_world_file(args.world, "val")
        tw.jobs = [_mark(args, jobs) for jobs in tw.jobs]
        vw.jobs = [_mark(args, jobs) for jobs in vw.jobs]
        short = [n for n, j in zip(tw.names, tw.jobs, strict=True) if len(j) < 2 * args.jobs]
        if short:
            raise UserError(f"world part {short[0]}: fewer than {2 * args.jobs} training jobs")
        return tw, vw
    if not args.clusters:
        raise UserError("give at least one --cluster (or --world FILE) to train on")
    clusters = [load_cluster(c) for c in args.clusters]
    jobs = _mark(args, load_jobs(args.trace, args.format, clusters[0], SkipStats()))
    until, val_from = when(args.until), when(args.val_from)
    end = until if until is not None else math.inf
    split = val_from if val_from is not None else end
    train = [j for j in jobs if j.submit_s < min(split, end)]
    val = [j for j in jobs if split <= j.submit_s < end]
    if len(train) < 4 * (args.prefix + args.jobs):
        raise UserError(f"only {len(train)} training jobs before --until; need more")
    names = [c.name for c in clusters]
    n = len(clusters)
    return (
        World(names, [train] * n, clusters),
        World(names, [val] * n if val else [], clusters if val else []),
    )


def world_needs(features: Sequence[str], worlds: Sequence[Sequence[TraceJob]]) -> list[str]:
    """The trace fields `features` read that every world's jobs carry (some job has
    it): what a checkpoint trained on `worlds` is refused without. A field some world
    lacked was 0 in all its episodes, as on any trace without it, so the network has
    learnt to rank without it."""
    return [f for f in needs_of(features) if all(any(getattr(j, f) for j in w) for w in worlds)]


def _mark(args: Args, jobs: list[TraceJob]) -> list[TraceJob]:
    if args.offload_fraction:
        jobs = mark_offloading(jobs, args.offload_fraction, args.seed)
    if args.share_fraction:
        jobs = mark_shares(jobs, args.share_fraction, args.seed)
    return jobs


def _train_world(args: Args) -> Worlds:
    train, _ = load_world(args)
    return train.jobs, train.clusters


def _val_world(args: Args) -> Worlds:
    _, val = load_world(args)
    return val.jobs, val.clusters


def episode_specs(
    n_jobs: Sequence[int],
    cfg: EpisodeConfig,
    count: int,
    seed: Sequence[int],
    every_world: bool = False,
) -> list[EpisodeSpec]:
    """`count` episodes: each a world (index into `n_jobs`, the worlds' job counts), a
    first job in it, a load in [load_lo, load_hi] and a seed. `every_world`: the
    worlds in turn (validation: each trace is judged, none left out by the draw)."""
    rng = np.random.default_rng(list(seed))
    out = []
    for i in range(count):
        w = int(rng.integers(len(n_jobs)))
        if every_world:
            w = i % len(n_jobs)
        last = max(n_jobs[w] - 4 * (cfg.prefix + cfg.jobs), 1)
        out.append(
            EpisodeSpec(
                w,
                int(rng.integers(last)),
                float(rng.uniform(cfg.load_lo, cfg.load_hi)),
                int(rng.integers(2**31 - 1)),
            )
        )
    return out


_BASE_READS = {
    "drf": ("vc_share_rank", "log_wait_s"),
    "f1": F1_FEATURES,
    "f1-unicep": F1_FEATURES,
}


def feature_list(args: Args) -> tuple[str, ...]:
    """The columns the network is given: the feature set, and for a residual on f1 (or
    f1-unicep) the two columns of its key (the base's alone: the network does not
    read them)."""
    features = FEATURE_SETS[args.features]
    if args.residual in KEY_BASES:
        features += tuple(f for f in F1_FEATURES if f not in features)
    return features


def net_config(args: Args, features: Sequence[str]) -> NetConfig:
    """The network `args` asks for, reading `features` (a residual base reads two)."""
    cols = {}
    if args.residual:
        for name in _BASE_READS[args.residual]:
            if name not in features:
                raise UserError(f"--residual {args.residual} needs the feature {name}")
            cols[name] = list(features).index(name)
    return NetConfig(
        len(features), len(GLOBAL_FEATURES), args.hidden, args.context, args.residual,
        cols.get("vc_share_rank", -1), cols.get("log_wait_s", -1),
        args.residual_bound if args.residual else 0.0,
        cols.get("f1_key", -1), cols.get("f1_key_rest", -1), args.residual_scale,
    )  # fmt: skip


def make_optimizer(net: torch.nn.Module, args: Args) -> torch.optim.Adam:
    """The optimiser PPO updates a policy network with (training and `scoring --learn`)."""
    return torch.optim.Adam(net.parameters(), lr=args.learning_rate, eps=1e-5)


def ppo_update(
    net: ScoreNet, opt: torch.optim.Optimizer, b: Batch, args: Args, gen: torch.Generator
) -> dict[str, float]:
    """One PPO update on an iteration's steps; returns the mean losses."""
    # ---- old log-probabilities and values, with the weights that drew the rollouts ----
    with torch.no_grad():
        scores, values = net(b.x, b.mask, b.g)
        b_logp = pl_log_prob(scores, b.perm, b.pulled)
        b_values = values
    # ---- advantages: GAE over each episode (reward on its last step) ----
    adv, ret = gae(b.rewards, b_values.double().numpy(), b.ends, args.gamma, args.gae_lambda)
    b_adv = torch.as_tensor(adv, dtype=torch.float32)
    b_ret = torch.as_tensor(ret, dtype=torch.float32)
    n = len(b)
    stats: dict[str, list[float]] = {k: [] for k in ("policy", "value", "entropy", "kl", "clip")}
    for _epoch in range(args.update_epochs):
        order = torch.randperm(n, generator=gen)
        for lo in range(0, n, args.minibatch_steps):
            mb = order[lo : lo + args.minibatch_steps]
            new_scores, new_v = net(b.x[mb], b.mask[mb], b.g[mb])
            new_logp = pl_log_prob(new_scores, b.perm[mb], b.pulled[mb])
            entropy = masked_entropy(new_scores, b.mask[mb])
            log_ratio = new_logp - b_logp[mb]
            with torch.no_grad():
                approx_kl = ((log_ratio.exp() - 1) - log_ratio).mean().item()
                clipped = ((log_ratio.exp() - 1.0).abs() > args.clip_coef).float().mean().item()
            mb_adv = b_adv[mb]
            if len(mb) > 1:
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
            # ---- policy loss ----
            pg_loss = clipped_policy_loss(new_logp, b_logp[mb], mb_adv, args.clip_coef)
            # ---- value loss ----
            v_loss = value_loss(
                new_v, b_values[mb], b_ret[mb], args.clip_coef if args.clip_vloss else None
            )
            ent = entropy.mean()
            loss = pg_loss - args.ent_coef * ent + args.vf_coef * v_loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), args.max_grad_norm)
            opt.step()
            for k, v in (
                ("policy", pg_loss.item()),
                ("value", v_loss.item()),
                ("entropy", ent.item()),
                ("kl", approx_kl),
                ("clip", clipped),
            ):
                stats[k].append(v)
        if args.target_kl and stats["kl"] and stats["kl"][-1] > args.target_kl:
            break
    # ---- observation normalisation: fold in this iteration's rows (used from the next) ----
    net.job_norm.update(b.x[b.mask].numpy())
    net.global_norm.update(b.g.numpy())
    return {k: float(np.mean(v)) if v else math.nan for k, v in stats.items()}


def warm_start(
    net: ScoreNet, opt: torch.optim.Optimizer, b: Batch, args: Args, gen: torch.Generator
) -> float:
    """Imitate the teacher's ranking on an iteration's rounds (Plackett-Luce
    likelihood of its order over the ranks read), so PPO explores around a sound
    heuristic instead of a random order. The rounds are those the current network
    visited (DAgger's data), so later warm-start iterations correct the states its
    own mistakes lead to. Returns the last minibatch's loss."""
    net.job_norm.update(b.x[b.mask].numpy())
    net.global_norm.update(b.g.numpy())
    loss = torch.zeros(())
    for group in opt.param_groups:
        group["lr"] = args.warm_learning_rate
    for _ in range(args.warm_start):
        order = torch.randperm(len(b), generator=gen)
        for lo in range(0, len(b), args.minibatch_steps):
            mb = order[lo : lo + args.minibatch_steps]
            scores, _ = net(b.x[mb], b.mask[mb], b.g[mb])
            # the teacher's order over at least its first 32 (what a round may read)
            depth = torch.minimum(b.mask[mb].sum(1), b.pulled[mb].clamp(min=32))
            loss = -pl_log_prob(scores, b.teacher[mb], depth).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), args.max_grad_norm)
            opt.step()
    for group in opt.param_groups:
        group["lr"] = args.learning_rate
    return float(loss.item())


def _validate(
    val: Rollouts,
    specs: Sequence[EpisodeSpec],
    cfg: EpisodeConfig,
    net: ScoreNet,
    features: tuple[str, ...],
    best_heuristic: Sequence[float],
    score: str = "mean",
) -> float:
    """The greedy policy against the best heuristic's objective on each episode (0: as
    good everywhere): the mean relative gain, or under "geo" 1 - the geometric mean
    of the policy's objective over the best's (`val_score_geo`)."""
    results = val.run(specs, cfg, net, features, sample=False)
    pairs = [(r.policy_obj, b) for r, b in zip(results, best_heuristic, strict=True)]
    if score == "geo":
        return val_score_geo(cfg.objective, pairs)
    return float(np.mean([relative_gain(cfg.objective, p, b) for p, b in pairs]))


def val_score_geo(objective: str, pairs: Sequence[tuple[float, float]]) -> float:
    """1 - exp(mean log(policy / best)) over the (policy, best) objectives of episodes
    where both are finite and positive (best / policy for "util", where higher is
    better); 0 if there is none."""
    logs = [
        math.log(b / p if objective == "util" else p / b)
        for p, b in pairs
        if math.isfinite(p) and math.isfinite(b) and p > 0 and b > 0
    ]
    return 1.0 - math.exp(sum(logs) / len(logs)) if logs else 0.0


def _heuristic_objs(
    val: Rollouts,
    cfg: EpisodeConfig,
    net: ScoreNet,
    features: tuple[str, ...],
    specs: list[EpisodeSpec],
    h: str,
) -> list[float]:
    """Heuristic h's objective on each validation episode (run as the baseline, the
    prefix included): the bar is each episode's best heuristic, as the matrix holds a
    policy to each cell's best."""
    res = val.run(specs, EpisodeConfig(**{**asdict(cfg), "baseline": h}), net, features)
    return [r.baseline_obj for r in res]


def train(
    args: Args, report: Callable[[IterationLog], None] | None = None
) -> tuple[Checkpoint, list[IterationLog]]:
    """Train; `report` is called after every iteration. Returns the best checkpoint."""
    validate(args)
    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # deterministic reductions; the workers use the other cores
    features = feature_list(args)
    # the episodes run without the wait bound: it is the served policy's (meta below);
    # trained with it, the policy validated worse (docs/results/rl.md, "How the shipped
    # checkpoint was trained and chosen")
    cfg = EpisodeConfig(
        args.prefix, args.jobs, args.load_lo, args.load_hi, args.baseline, args.objective,
        args.placer, args.window, args.offload_reward, args.reward == "round",
        args.shuffle_ties, fill_load=args.fill_load,
    )  # fmt: skip
    train_w, val_w = load_world(args)
    # ---- the network, the optimizer, or both from a checkpoint ----
    start_iter = 0
    if args.resume:
        ckpt = load_checkpoint(args.resume)
        if ckpt.features != features:
            raise UserError(
                f"--resume {args.resume}: trained on feature set {ckpt.meta.get('features_set')}, "
                f"not {args.features}"
            )
        net = ckpt.net
        opt = make_optimizer(net, args)
        if ckpt.optimizer:
            opt.load_state_dict(ckpt.optimizer)
        start_iter = int(ckpt.state.get("iteration", 0))
        t_start -= float(ckpt.state.get("elapsed_s", 0.0))  # the budget and log count it all
    else:
        net = ScoreNet(net_config(args, features))
        opt = make_optimizer(net, args)
    meta: dict[str, Any] = dict(ckpt.meta) if args.resume else {}
    meta |= {
        "args": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(args).items()},
        "features_set": args.features,
        "trace": args.trace,
        "format": args.format,
        "world": Path(args.world).read_text() if args.world else None,
        "clusters": {c: Path(c).read_text() for c in args.clusters},
        "train_jobs": sum(map(len, {id(j): j for j in train_w.jobs}.values())),
        "val_jobs": sum(map(len, {id(j): j for j in val_w.jobs}.values())),
        "max_wait_s": args.max_wait_h * 3600.0 if args.max_wait_h else None,
        "bound_gpus": args.bound_gpus,
        "bound_scale": args.bound_scale,
        # the trace fields its identity features were computed from in every training
        # world: served on a trace without one of these, it is refused. A field some
        # world lacked is not needed: there it was always 0, as it is on such a trace,
        # so the network has learnt what to do without it (masked as 0).
        "needs": world_needs(features, train_w.jobs),
    }
    if args.offload_fraction:
        meta["offload_marking"] = describe_marking(args.offload_fraction, args.seed)
    if args.share_fraction:
        meta["share_marking"] = describe_shares(args.share_fraction, args.seed)
    # ---- rollout workers; validation episodes and the best heuristic on them ----
    rollouts = Rollouts(functools.partial(_train_world, args), args.workers)
    val = Rollouts(functools.partial(_val_world, args), args.workers) if val_w.jobs else None
    val_specs: list[EpisodeSpec] = []
    best_h, best_objs = list[str](), list[float]()
    if val is not None:
        # every episode's load is in its spec (validation.py): the range is the training one
        val_cfg = cfg
        vs = validation_set(
            val_w.jobs, val_w.clusters, val_cfg, args.val_episodes, [args.seed, 999_999],
            functools.partial(_heuristic_objs, val, val_cfg, net, features), HEURISTICS,
        )  # fmt: skip
        val_specs, best_h, best_objs = vs.specs, vs.best_heuristic, vs.best_obj
        if not val_specs:
            raise UserError("every validation episode of the world left the queue empty")
        meta["validation"] = {
            "best_heuristic": best_h, "objective": best_objs,
            "episodes": [[val_w.names[s.cluster], s.start, s.load, s.seed] for s in val_specs],
            "loads": vs.loads, "dropped_no_queue": vs.dropped, "given_up": vs.given_up,
        }  # fmt: skip
    logs: list[IterationLog] = []
    best_val = float(meta.get("val_gain", -math.inf))  # a resumed run keeps its best
    best_ckpt = Checkpoint(net, features, meta)
    log_path = Path(args.log or Path(args.out).with_suffix(".csv"))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("a" if args.resume else "w", newline="")
    writer = csv.writer(log_file)
    if not args.resume:
        writer.writerow(
            ["iteration", "time_s", "steps", "charts/episodic_reward", "charts/val_gain",
             "losses/policy", "losses/value", "losses/entropy", "losses/approx_kl",
             "losses/clipfrac", "losses/imitation", "perf/rollout_s", "perf/update_s",
             "perf/decisions_per_s", "perf/jobs_per_s"]
        )  # fmt: skip
    if val is not None and args.residual and not args.resume:
        # iteration 0, the untrained residual, is the base heuristic itself: scored and
        # kept as the checkpoint, so that a run in which nothing beats it returns it
        best_val = _validate(val, val_specs, val_cfg, net, features, best_objs, args.val_score)
        meta.update(val_gain=best_val, iteration=0)
        best_ckpt = Checkpoint(_copy(net), features, dict(meta))
        save_checkpoint(args.out, best_ckpt)
        writer.writerow(
            [0, f"{time.perf_counter() - t_start:.1f}", 0, "", f"{best_val:.4f}",
             *("" for _ in LOSSES), "", "", "", ""]
        )  # fmt: skip
        log_file.flush()
    try:
        for it in range(start_iter, args.iterations):
            if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
                break
            # ---- rollouts ----
            t0 = time.perf_counter()
            specs = episode_specs(
                [len(j) for j in train_w.jobs], cfg, args.episodes, [args.seed, it]
            )
            warm = it < args.warm_iterations and args.warm_start > 0
            run_cfg = cfg
            if warm and args.teacher not in TEACHERS:  # a heuristic rides along (env)
                run_cfg = dataclasses.replace(cfg, teacher=args.teacher)
            results: list[EpisodeResult] = rollouts.run(specs, run_cfg, net, features)
            rollout_s = time.perf_counter() - t0
            # ---- update ----
            t1 = time.perf_counter()
            batch = make_batch(results, features, args.teacher)
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + it)  # resumable
            losses: dict[str, float] = {}
            if warm and batch is not None:
                # the rounds the current network visited, ranked by the teacher: imitate
                losses["warm_start"] = warm_start(net, opt, batch, args, gen)
            elif batch is not None:
                losses = ppo_update(net, opt, batch, args, gen)
            update_s = time.perf_counter() - t1
            # ---- validation and checkpoints ----
            val_gain = None
            last = it + 1 == args.iterations
            if val is not None and ((it + 1) % args.val_every == 0 or last):
                val_gain = _validate(
                    val, val_specs, val_cfg, net, features, best_objs, args.val_score
                )
                if val_gain > best_val:
                    best_val = val_gain
                    meta.update(val_gain=val_gain, iteration=it + 1)
                    best_ckpt = Checkpoint(_copy(net), features, dict(meta))
                    save_checkpoint(args.out, best_ckpt)
            if args.keep_every and (it + 1) % args.keep_every == 0:
                meta_it = dict(meta) | {"iteration": it + 1, "val_gain_here": val_gain}
                save_checkpoint(_nth(args.out, it + 1), Checkpoint(net, features, meta_it))
            state = {"iteration": it + 1, "elapsed_s": time.perf_counter() - t_start}
            save_checkpoint(
                _last(args.out), Checkpoint(net, features, meta, opt.state_dict(), state)
            )
            log = IterationLog(
                it + 1,
                len(batch) if batch is not None else 0,
                float(np.mean([r.reward for r in results])),
                update_s,
                rollout_s,
                sum(r.decisions for r in results),
                sum(2 * r.jobs for r in results),
                losses,
                val_gain,
            )
            logs.append(log)
            writer.writerow(
                [log.iteration, f"{time.perf_counter() - t_start:.1f}", log.steps,
                 f"{log.reward:.4f}", "" if val_gain is None else f"{val_gain:.4f}",
                 *(f"{losses.get(k, math.nan):.4f}" for k in LOSSES),
                 f"{rollout_s:.2f}", f"{update_s:.2f}",
                 f"{log.decisions / rollout_s:.0f}", f"{log.jobs / rollout_s:.0f}"]
            )  # fmt: skip
            log_file.flush()
            if report is not None:
                report(log)
    finally:
        log_file.close()
        rollouts.close()
        if val is not None:
            val.close()
    if best_val == -math.inf:  # no validation ran: the last weights are the result
        best_ckpt = Checkpoint(net, features, meta)
        save_checkpoint(args.out, best_ckpt)
    return best_ckpt, logs


def _copy(net: ScoreNet) -> ScoreNet:
    twin = ScoreNet(net.cfg)
    twin.load_state_dict(net.state_dict())
    return twin


def _nth(out: str, iteration: int) -> Path:
    p = Path(out)
    return p.with_name(f"{p.stem}.it{iteration}{p.suffix}")


def _last(out: str) -> Path:
    p = Path(out)
    return p.with_name(p.stem + ".last" + p.suffix)
