"""`rltune why JOB_ID`: why a job waits, what would start it, and its expected start,
read from the topics of a running deployment (`services.scoring.why` says how)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import TYPE_CHECKING

from aiokafka.errors import KafkaError

from rltune.common import (
    add_bus_args,
    bus_settings,
    finite_or_null,
    run_async,
    unreachable,
    write_json,
)
from shared.cluster import load_cluster
from shared.config import BusSettings
from shared.errors import UserError

if TYPE_CHECKING:
    from services.scoring.why import WhyState

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("why", help="why a job waits, what change would start it, its ETA")
    p.add_argument("job_id", metavar="JOB_ID", help="the job's id, as submitted")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the answer as JSON")
    p.add_argument(
        "--cluster",
        default=None,
        metavar="FILE",
        help="the deployment's cluster file: its queues and priority classes, to name the "
        "queue rule that holds a job (limit, reclaim, preemption, non-preemptible, priority)",
    )
    p.add_argument(
        "--min-run",
        type=float,
        default=600.0,
        metavar="S",
        help="the deployment's minimum run time (scoring's --min-run; default 600): when a "
        "job that reclaim or a priority preemption would stop may be stopped",
    )
    add_bus_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.scoring.why import WhyState

    if not args.min_run >= 0.0 or args.min_run == float("inf"):
        raise UserError(f"--min-run must be a finite number of seconds >= 0, got {args.min_run:g}")
    cluster = load_cluster(args.cluster) if args.cluster else None
    settings = bus_settings(args)
    state = WhyState(settings.topics, cluster, args.min_run)
    run_async(_read(settings, state))
    state.present(time.time())  # a live cluster's present is the wall clock
    answer = state.explain(args.job_id)
    if answer.state == "unknown":
        raise UserError(answer.lines[0])
    sys.stdout.write("\n".join(answer.lines) + "\n")
    if args.json:
        write_json(finite_or_null(dataclasses.asdict(answer)), args.json)
    return 0


async def _read(settings: BusSettings, state: WhyState) -> None:
    from shared.wire import read_back

    try:
        await read_back(settings, state.topics, state.add)
    except (KafkaError, OSError) as exc:
        raise unreachable(settings, exc) from None
