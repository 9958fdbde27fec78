"""`rltune bench val_episodes`: the validation episodes `rltune train --world FILE`
scores its checkpoints on, one row each: every heuristic's and every given
checkpoint's objective over the episode's best heuristic's, and the geometric
mean and mean relative gain over the episodes (the two `--val-score`s). What a
checkpoint is chosen on, next to what the validation matrix reports.

    rltune bench val_episodes --world bench/worlds/mixed.yaml \\
        [--checkpoints models/rl-mixed.pt,...] [--val-episodes 12] [--seed 1] \\
        [--load-lo 0.6 --load-hi 1.2]

The episodes are the trainer's for the same world, seed, episode count and load
range (services/scoring/rl/validation.py; the defaults here are rl-mixed's): each
row gives the episode's load as drawn and as built; the candidates dropped because
every heuristic was within 0.1% of each other are counted under the table.
"""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import asdict

from services.scoring.rl.args import HEURISTICS, Args
from services.scoring.rl.checkpoint import load_checkpoint
from services.scoring.rl.env import EpisodeConfig, EpisodeSpec
from services.scoring.rl.network import NetConfig, ScoreNet
from services.scoring.rl.rollout import Rollouts
from services.scoring.rl.train import _val_world, load_world
from services.scoring.rl.validation import validation_set
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
    p.add_argument("--load-lo", type=float, default=0.6)
    p.add_argument("--load-hi", type=float, default=1.2)
    p.add_argument("--fill-load", action="store_true", help="rltune train's --fill-load")
    a = p.parse_args(argv)
    args = Args(world=a.world, baseline=a.baseline, seed=a.seed, workers=0,
                val_episodes=a.val_episodes, prefix=a.prefix, jobs=a.jobs)  # fmt: skip
    _, val_w = load_world(args)
    if not val_w.jobs:
        raise UserError(f"--world {a.world}: no part has a validation range (val:)")
    cfg = EpisodeConfig(
        args.prefix, args.jobs, a.load_lo, a.load_hi, args.baseline, args.objective,
        args.placer, args.window, args.offload_reward, True, args.shuffle_ties,
        fill_load=a.fill_load,
    )  # fmt: skip
    val = Rollouts(functools.partial(_val_world, args), 0)
    try:
        stand_in = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES)))

        def run(specs: list[EpisodeSpec], h: str) -> list[float]:
            hc = EpisodeConfig(**{**asdict(cfg), "baseline": h})
            return [r.baseline_obj for r in val.run(specs, hc, stand_in, JOB_FEATURES)]

        vs = validation_set(val_w.jobs, val_w.clusters, cfg, a.val_episodes,
                            [a.seed, 999_999], run, HEURISTICS)  # fmt: skip
        specs = vs.specs
        objs: dict[str, list[float]] = dict(vs.objs)
        for path in filter(None, a.checkpoints.split(",")):
            ck = load_checkpoint(path)
            res = val.run(specs, cfg, ck.net, ck.features, sample=False)
            objs[path] = [r.policy_obj for r in res]
    finally:
        val.close()
    best = [min(objs[h][i] for h in HEURISTICS) for i in range(len(specs))]
    names = list(objs)
    head = "| episode (world, first job) | load (built) | best avg bsld | "
    print(head + " | ".join(names) + " |")
    print("|---|---:|---:|" + "---:|" * len(names))
    for i, spec in enumerate(specs):
        cells = " | ".join(f"{objs[k][i] / best[i]:.3f}" for k in names)
        where = f"{i} ({val_w.names[spec.cluster]}, {spec.start})"
        print(f"| {where} | {spec.load:.2f} ({vs.loads[i]:.2f}) | {best[i]:.3f} | {cells} |")
    geo = [math.exp(sum(math.log(objs[k][i] / best[i]) for i in range(len(specs))) / len(specs))
           for k in names]  # fmt: skip
    gain = [sum((best[i] - objs[k][i]) / best[i] for i in range(len(specs))) / len(specs)
            for k in names]  # fmt: skip
    print("| geometric mean | | | " + " | ".join(f"{g:.3f}" for g in geo) + " |")
    print("| mean relative gain | | | " + " | ".join(f"{g:.3f}" for g in gain) + " |")
    print(
        f"\nDropped (every heuristic within 0.1%: nothing queued) and drawn again: "
        f"{vs.dropped}; slots left empty: {len(vs.given_up)}"
    )
    return 0
