"""GPU shares for traces that have none (Philly): `mark_shares` turns a seeded
fraction of the whole one-GPU jobs into fractional-GPU jobs, so that a policy
trained on such a trace sees the `share` feature vary (clusters that pack several
jobs on one GPU, as Alibaba's does, ask it to rank shares).

A marked job asks for `SHARE_MILLI` thousandths of one GPU, uniform over the
quarter, half and three-quarter GPU, and keeps its run time: what the trace
recorded is taken as how long it ran on its slice. The distribution is a stated
choice, not fitted to any trace; multi-GPU jobs and jobs already fractional are
left alone. Off unless asked (`rltune train --share-fraction`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from shared.errors import UserError
from shared.placement_api import FULL_GPU
from shared.traces import TraceJob

__all__ = ["SHARE_MILLI", "check_fraction", "describe_shares", "mark_shares"]

SHARE_MILLI = (250, 500, 750)  # thousandths of one GPU a marked job asks for


def describe_shares(fraction: float, seed: int) -> str:
    sizes = ", ".join(f"{m / FULL_GPU:g}" for m in SHARE_MILLI)
    return (
        f"shares: {fraction:.0%} of whole one-GPU jobs made GPU shares (seed {seed}), "
        f"of uniformly {sizes} of one GPU, run times as recorded"
    )


def check_fraction(fraction: float) -> None:
    """UserError (one line) unless `fraction` is a share of jobs, in [0, 1]."""
    if not 0.0 <= fraction <= 1.0:
        raise UserError(f"--share-fraction must be within [0, 1], got {fraction}")


def mark_shares(jobs: Sequence[TraceJob], fraction: float, seed: int) -> list[TraceJob]:
    """`jobs` with a seeded `fraction` of the whole one-GPU ones made GPU shares."""
    check_fraction(fraction)
    rng = random.Random(f"share-{seed}")
    out = []
    for j in jobs:
        # two draws per job whatever the outcome: a job's share does not depend on others
        pick, which = rng.random(), rng.randrange(len(SHARE_MILLI))
        if j.num_gpus == 1 and j.gpu_milli == FULL_GPU and pick < fraction:
            j = replace(j, gpu_milli=SHARE_MILLI[which])
        out.append(j)
    return out
