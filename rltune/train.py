"""`rltune train`: PPO training of the learned policy, with a progress bar
(reward, validation score against the best heuristic), a CSV log, checkpoints
and `--resume`. The flags are `services.scoring.rl.train.Args`' fields."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

__all__ = ["register", "run"]

_FLAGS = {"clusters": "cluster"}  # field -> flag where they differ


def register(sub: argparse._SubParsersAction) -> None:
    from services.scoring.rl.args import Args

    p = sub.add_parser("train", help="train the learned policy with PPO")
    p.add_argument("--trace", default="", help=_doc("trace") + " (or --world)")
    p.add_argument("--format", default="philly", help=_doc("format"))
    p.add_argument(
        "--cluster",
        default="",
        help="cluster file(s) to train on, comma-separated; episodes draw one at random",
    )
    p.add_argument("--out", required=True, metavar="MODEL", help=_doc("out"))
    p.add_argument("--epochs", type=int, default=None, help="PPO iterations (= --iterations)")
    defaults = Args()
    for f in dataclasses.fields(Args):
        if f.name in ("trace", "format", "clusters", "out"):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            p.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=_doc(f.name)
            )
        else:
            p.add_argument(
                flag, type=type(default), default=default, help=f"{_doc(f.name)} ({default})"
            )
    p.set_defaults(func=run)


def _doc(name: str) -> str:
    from services.scoring.rl.args import ARG_DOCS

    return ARG_DOCS.get(name, "")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from services.scoring.rl.args import Args, validate
    from services.scoring.rl.train import IterationLog, train

    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(Args)
        if f.name not in ("clusters",) and hasattr(args, f.name)
    }
    values["clusters"] = tuple(c.strip() for c in args.cluster.split(",") if c.strip())
    if args.epochs is not None:
        values["iterations"] = args.epochs
    targs = Args(**values)
    validate(targs)
    console = Console(stderr=True)
    if targs.offload_fraction:
        from shared.sim.offload_jobs import describe_marking

        console.print(describe_marking(targs.offload_fraction, targs.seed))
    if targs.share_fraction:
        from shared.sim.share_jobs import describe_shares

        console.print(describe_shares(targs.share_fraction, targs.seed))
    start = time.perf_counter()
    columns = (
        TextColumn("PPO"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} it"),
        TextColumn("reward {task.fields[reward]}  val {task.fields[val]}  {task.fields[rate]}"),
        TimeElapsedColumn(),
    )
    # the bar starts with the first iteration, so a mistake found before it is one line
    bar = Progress(*columns, console=console)
    task = None

    def report(log: IterationLog) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("train", total=targs.iterations, reward="-", val="-", rate="")
        fields = bar.tasks[0].fields
        val = fields["val"] if log.val_gain is None else f"{log.val_gain:+.1%} vs best heuristic"
        bar.update(
            task,
            completed=log.iteration,
            reward=f"{log.reward:+.3f}",
            val=val,
            rate=f"{log.decisions / max(log.rollout_s, 1e-9):.0f} decisions/s",
        )

    try:
        ckpt, logs = train(targs, report)
    finally:
        bar.stop()
    took = time.perf_counter() - start
    val = ckpt.meta.get("val_gain")
    print(
        f"trained {len(logs)} iterations in {took:.0f} s; wrote {targs.out}"
        + (
            f" (validation: {val:+.1%} vs each validation episode's best heuristic)"
            if val is not None
            else ""
        ),
        file=sys.stderr,
    )
    return 0
