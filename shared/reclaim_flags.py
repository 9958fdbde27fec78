"""The preemption flags of every command that preempts, defined once.

`--grace`, `--min-run`, `--checkpoint` and `--no-reclaim` tune reclaim (a queue's
guarantee taken back from borrowers) and priority preemption (shared/tenancy.py
rules 4 and 5). Four commands take them, on two sides:

* `live`: scoring (`rltune service scoring`, free rounds) asks the host agents to
  stop real processes: SIGTERM, then SIGKILL after the grace period (`KillRequest.
  grace_s`, at most a day);
* `sim`: `rltune simulate` and cluster-sim preempt simulated jobs: the grace period
  is time the job keeps its GPUs after the stop, and the restart cost (the work since
  the last checkpoint, every `--checkpoint` seconds) is charged to it;
* `both`: `rltune up`, whose local hosts (`--queues`) are live and whose replay
  (`--trace`) is simulated; its flags default to unset, so that it can tell what was
  given and hand it on.

Defaults, bounds and the words of each help come from here, so they agree; each
command's help says which side it is on. Argparse only: `shared/` is the bottom
layer, and every command (services/ and rltune/) may import it.
"""

from __future__ import annotations

import argparse
import math
from typing import Literal

from shared.errors import UserError

__all__ = [
    "CHECKPOINT_S",
    "GRACE_S",
    "MAX_LIVE_S",
    "MIN_RUN_S",
    "Side",
    "add_reclaim_args",
    "check_reclaim_args",
]

GRACE_S = 120.0
MIN_RUN_S = 600.0
CHECKPOINT_S = 1800.0
MAX_LIVE_S = 86_400.0  # a live grace period travels in KillRequest.grace_s (<= a day)

Side = Literal["live", "sim", "both"]

_GRACE = {
    "live": "preemption on real hosts: a preempted job's process group gets SIGTERM, then "
    "SIGKILL after S seconds",
    "sim": "simulated preemption: a preempted job keeps its GPUs S seconds after its stop "
    "is decided (its SIGTERM's grace period)",
    "both": "preemption's grace period: on the local hosts (--queues) SIGTERM, then SIGKILL "
    "after S seconds; in a replay (--trace) the simulated job keeps its GPUs S seconds",
}
_MIN_RUN = {
    "live": "preemption on real hosts: a job is never preempted in its first S seconds",
    "sim": "simulated preemption: a job is never preempted in its first S seconds of a run",
    "both": "preemption (local hosts and replay alike): a job is never preempted in its "
    "first S seconds of a run",
}
_CHECKPOINT = {
    "sim": "simulated restart cost: a preempted job loses the work since its last "
    "checkpoint, taken every S seconds of a run",
    "both": "a replay's simulated restart cost (real jobs checkpoint themselves): a "
    "preempted job loses the work since its last checkpoint, every S seconds of a run",
}
_NO_RECLAIM = {
    "sim": "never preempt borrowers for a queue's guarantee (reclaim is on wherever a queue "
    "of the cluster file has guaranteed_gpus; docs/guide/tenancy.md)",
    "both": "a replay without reclaim (as simulate's)",
}


def add_reclaim_args(p: argparse.ArgumentParser, side: Side) -> None:
    """`--grace` and `--min-run`, and on the simulated sides `--checkpoint` and
    `--no-reclaim` (on the live side a job's checkpoints are its own, and reclaim is
    on wherever the cluster file has guarantees)."""
    unset = side == "both"

    def default(v: float) -> float | None:
        return None if unset else v

    def shown(v: float) -> str:
        return f" (default {v:g})"

    p.add_argument(
        "--grace", type=float, default=default(GRACE_S), metavar="S",
        help=_GRACE[side] + shown(GRACE_S),
    )  # fmt: skip
    p.add_argument(
        "--min-run", type=float, default=default(MIN_RUN_S), metavar="S",
        help=_MIN_RUN[side] + shown(MIN_RUN_S),
    )  # fmt: skip
    if side == "live":
        return
    p.add_argument(
        "--checkpoint", type=float, default=default(CHECKPOINT_S), metavar="S",
        help=_CHECKPOINT[side]
        + f" (default {CHECKPOINT_S:g}; a priority class's checkpoint_s wins)",
    )  # fmt: skip
    p.add_argument("--no-reclaim", action="store_true", help=_NO_RECLAIM[side])


def check_reclaim_args(args: argparse.Namespace, live: bool) -> None:
    """A one-line error for a value out of range among the flags given (absent or unset
    ones pass): live, a grace period or minimum run within [0, MAX_LIVE_S] seconds;
    simulated, any finite number >= 0 (a checkpoint interval > 0)."""
    for name, lo in (("grace", 0.0), ("min_run", 0.0), ("checkpoint", 1e-9)):
        v = getattr(args, name, None)
        if v is None:
            continue
        flag = "--" + name.replace("_", "-")
        if live and name != "checkpoint":
            if not 0.0 <= v <= MAX_LIVE_S:
                raise UserError(f"{flag} must be within [0, {MAX_LIVE_S:g}] seconds, got {v:g}")
        elif not (math.isfinite(v) and v >= lo):
            raise UserError(f"{flag} must be a number of seconds {'>' if lo else '>='} 0, got {v}")
