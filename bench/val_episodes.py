"""`rltune bench val_episodes`: the validation episodes `rltune train --world FILE`
scores its checkpoints on, one row each: every heuristic's and every given
checkpoint's objective over the episode's best heuristic's, and the geometric
mean and mean relative gain over the episodes (the two `--val-score`s). What a
checkpoint is chosen on, next to what the validation matrix reports.

    rltune bench val_episodes --world bench/worlds/mixed.yaml \\
        [--checkpoints models/rl-mixed.pt,...] [--val-episodes 12] [--seed 1]

The episodes are the trainer's for the same world, seed, episode count and load
range (its defaults here: rl-mixed's; `--load-lo/--load-hi` do not change them,
since validation runs every episode at load 0.95).
"""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import asdict

from services.scoring.rl.args import HEURISTICS, Args
from services.scoring.rl.checkpoint import load_checkpoint
from services.scoring.rl.env import EpisodeConfig
from services.scoring.rl.network import NetConfig, ScoreNet
from services.scoring.rl.rollout import Rollouts
from services.scoring.rl.train import _val_world, episode_specs, load_world
from shared.errors import UserError
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="rltune bench val_episodes", description=__doc__.splitlines()[0]
    )
    p.add_argument("--world", required=True)
    p.add_argument("--checkpoints", default="", help="comma-separated checkpoints to score")
    p.add_argument("--val-episodes", type=int, default=12)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--baseline", default="f1", help="the prefix's policy (the trainer's)")
    p.add_argument("--prefix", type=int, default=Args.prefix)
    p.add_argument("--jobs", type=int, default=Args.jobs)
    a = p.parse_args(argv)
    args = Args(world=a.world, baseline=a.baseline, seed=a.seed, workers=0,
                val_episodes=a.val_episodes, prefix=a.prefix, jobs=a.jobs)  # fmt: skip
    _, val_w = load_world(args)
    if not val_w.jobs:
        raise UserError(f"--world {a.world}: no part has a validation range (val:)")
    cfg = EpisodeConfig(
        args.prefix, args.jobs, 0.95, 0.95, args.baseline, args.objective, args.placer,
        args.window, args.offload_reward, True, args.shuffle_ties,
    )  # fmt: skip
    specs = episode_specs(
        [len(j) for j in val_w.jobs], cfg, a.val_episodes, [a.seed, 999_999], every_world=True
    )
    val = Rollouts(functools.partial(_val_world, args), 0)
    try:
        stand_in = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES)))
        objs: dict[str, list[float]] = {}
        for h in HEURISTICS:  # each heuristic on the whole episode (the prefix included)
            res = val.run(specs, EpisodeConfig(**{**asdict(cfg), "baseline": h}), stand_in,
                          JOB_FEATURES)  # fmt: skip
            objs[h] = [r.baseline_obj for r in res]
        for path in filter(None, a.checkpoints.split(",")):
            ck = load_checkpoint(path)
            res = val.run(specs, cfg, ck.net, ck.features, sample=False)
            objs[path] = [r.policy_obj for r in res]
    finally:
        val.close()
    best = [min(objs[h][i] for h in HEURISTICS) for i in range(len(specs))]
    names = list(objs)
    print("| episode (world) | best avg bsld | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for i, spec in enumerate(specs):
        cells = " | ".join(f"{objs[k][i] / best[i]:.3f}" for k in names)
        print(f"| {i} ({val_w.names[spec.cluster]}) | {best[i]:.3f} | {cells} |")
    geo = [math.exp(sum(math.log(objs[k][i] / best[i]) for i in range(len(specs))) / len(specs))
           for k in names]  # fmt: skip
    gain = [sum((best[i] - objs[k][i]) / best[i] for i in range(len(specs))) / len(specs)
            for k in names]  # fmt: skip
    print("| geometric mean | | " + " | ".join(f"{g:.3f}" for g in geo) + " |")
    print("| mean relative gain | | " + " | ".join(f"{g:.3f}" for g in gain) + " |")
    return 0
