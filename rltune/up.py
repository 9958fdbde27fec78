"""`rltune up`: the embedded broker, every service as its own process, and a cluster
that runs jobs, with a live view of the run.

Two kinds of cluster:

* with no `--trace` (the default), a local cluster that runs the jobs users
  publish: `--hosts` host agents (`rltune service offload-agent`) on this machine,
  each advertising `--gpus` emulated GPUs of type `--gpu-type` (or, on a machine
  where pynvml sees GPUs and neither flag is given, one agent on those). A placed
  job's `command` runs as a real process with `CUDA_VISIBLE_DEVICES` set to the
  GPUs it was given; its stdout and stderr go to the run's log folder
  (jobs/<host>/<job>.out, .err). Nothing is replayed. With `--queues FILE` (the
  `queues:` and `priority_classes:` of a cluster file) the team queues hold on
  these hosts: scoring reclaims a queue's guarantee by preempting borrowers
  (`--grace`, `--min-run`), and the host agents stop and requeue their processes.
* with `--trace`, the simulated cluster (cluster-sim) and a replay of the trace.
  A job a user publishes meanwhile is refused at once on `jobs.rejected` with the
  reason (the arrival service runs with `--user-jobs reject`): the simulated
  cluster runs only the trace's jobs, which the replay marks as its own.

Each service is `rltune service NAME` in a child process (its log in the run's
log folder), tied to this process (it gets SIGTERM if this process dies) and in
its own process group, so Ctrl-C reaches this process only: it stops the replay,
then asks every service to stop (SIGTERM: each commits what it has done), kills
what has not stopped after a grace period, then stops the broker.

The simulated cluster is cluster-sim: `--lockstep` runs virtual time round by
round, otherwise its clock follows the wall clock at `--speedup`. The replay
publishes each job with its trace submit time. With `--until-done` the run ends
when cluster-sim has simulated the whole trace; `--json` and `--jobs-out` are
then written by it, exactly as `rltune simulate` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec
import yaml
from aiokafka import AIOKafkaConsumer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from rltune.common import (
    port_number,
    positive_int,
    round_interval,
    run_async,
    write_json,
)
from shared.broker import EmbeddedBroker, _die_with_parent, ensure_topics, free_port
from shared.bus import Producer, partitions_of
from shared.cluster import ClusterSpec, load_cluster, parse_cluster
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import MetricsSnapshot, encode
from shared.placement_api import DISCIPLINES
from shared.reclaim_flags import add_reclaim_args, check_reclaim_args
from shared.replay import REPLAY_HEADERS, Paced, job_spec_of, paced
from shared.traces import SkipStats, TraceJob

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "philly-2000.jsonl"
# Real time's default round interval (trace seconds): Slurm's default sched_interval.
# A round over the bus costs tens of ms of wall time (score, then place), i.e. tens of
# trace seconds at --speedup 1000; a round at every event then falls behind the
# replay by hours within minutes (make up, before: 13.7 h behind after 100 s).
REAL_TIME_INTERVAL_S = 60.0
CLUSTER = ROOT / "clusters" / "philly.yaml"
LOCAL_HOSTS = 2  # the local cluster's default: two hosts of four emulated GPUs
LOCAL_GPUS = 4
LOCAL_GPU_TYPE = "GPU"
NOT_GIVEN = (None, False)
# flags of a replay alone: with no --trace each is a mistake, said in one line
REPLAY_ONLY = (
    "cluster", "format", "limit", "speedup", "lockstep", "round_interval", "offload_fraction",
    "preempt", "until_done", "json", "jobs_out", "checkpoint", "no_reclaim",
)  # fmt: skip
STOP_GRACE_S = 10.0
FIGURES = "telemetry.all"  # the source of telemetry's figures over every finished job


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up", help="embedded broker + every service + a local cluster (or a trace replay)"
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="replay this trace on a simulated cluster instead of running users' jobs "
        f"(the sample: {SAMPLE.relative_to(ROOT)})",
    )
    p.add_argument("--format", default=None, help="trace format (default jsonl)")
    p.add_argument("--limit", type=positive_int, default=None, help="replay only the first N jobs")
    p.add_argument(
        "--cluster",
        default=None,
        help="cluster spec of a replay (default philly.yaml); the local cluster is its hosts "
        "as they report",
    )
    p.add_argument(
        "--hosts",
        type=positive_int,
        default=None,
        help=f"host agents of the local cluster (default {LOCAL_HOSTS})",
    )
    p.add_argument(
        "--gpus",
        type=positive_int,
        default=None,
        help=f"emulated GPUs per host (default {LOCAL_GPUS})",
    )
    p.add_argument(
        "--gpu-type",
        default=LOCAL_GPU_TYPE,
        help=f"the emulated GPUs' type name (default {LOCAL_GPU_TYPE})",
    )
    p.add_argument(
        "--queues",
        type=Path,
        default=None,
        help="the local cluster's team queues: a YAML file with `queues:` and "
        "`priority_classes:` as a cluster file has them (guarantees are reclaimed by "
        "preempting borrowers: docs/guide/tenancy.md)",
    )
    add_reclaim_args(p, "both")
    p.add_argument("--policy", default="fifo", help="scheduling policy (default fifo)")
    p.add_argument("--placer", default="milp", help="placement (default milp)")
    p.add_argument("--window", type=int, default=128, help="jobs per round (K)")
    p.add_argument(
        "--discipline", default="easy", choices=DISCIPLINES, help="as simulate's (default easy)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--speedup", type=float, default=None, help="trace time / wall time (default 1000)"
    )
    p.add_argument("--lockstep", action="store_true", help="virtual time, round by round")
    p.add_argument(
        "--round-interval",
        type=float,
        default=None,
        metavar="S",
        help="rounds at most every S s of trace time, as simulate's --round-interval (default: "
        f"{REAL_TIME_INTERVAL_S:g} in real time, so that rounds keep pace with the replay at "
        "--speedup 1000; 0 under --lockstep: a round at every event, as simulate)",
    )
    p.add_argument(
        "--offload-fraction",
        type=float,
        default=None,
        help="share of jobs without a model size marked as offloading (as simulate)",
    )
    p.add_argument("--preempt", action="store_true", help="let a preemptive policy (las) preempt")
    p.add_argument("--until-done", action="store_true", help="exit when the trace is done")
    p.add_argument("--json", default=None, help="summary JSON at the end (as simulate)")
    p.add_argument("--jobs-out", default=None, help="per-job CSV at the end (as simulate)")
    p.add_argument(
        "--port", type=port_number, default=None, help="broker port (default: 9092 if free)"
    )
    p.add_argument("--topic-prefix", default=None, help="topic name prefix")
    p.add_argument("--logs", type=Path, default=None, help="folder for the services' logs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trace is None:
        return run_local(args)
    if args.hosts is not None or args.gpus is not None:
        raise UserError("--hosts and --gpus size the local cluster: they go without --trace")
    if args.queues is not None:
        raise UserError("--queues is the local cluster's: a replay takes its queues from --cluster")
    check_reclaim_args(args, live=False)  # (a replay's preemption is simulated)
    args.format = args.format or "jsonl"
    args.cluster = args.cluster or str(CLUSTER)
    args.speedup = 1000.0 if args.speedup is None else args.speedup
    args.offload_fraction = args.offload_fraction or 0.0
    if args.speedup <= 0:
        raise UserError("--speedup must be positive")
    if args.round_interval is None:
        args.round_interval = 0.0 if args.lockstep else REAL_TIME_INTERVAL_S
    round_interval(args.round_interval)
    if not 0.0 <= args.offload_fraction <= 1.0:
        raise UserError(f"--offload-fraction must be within [0, 1], got {args.offload_fraction}")
    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy

    make_policy(args.policy)
    make_placer(args.placer)
    cluster = load_cluster(args.cluster)
    stats = SkipStats()
    schedule = list(paced(replay_jobs(args, cluster, stats), args.speedup))
    console = Console(stderr=True)
    with _broker(args) as (broker, settings, logs):
        console.print(
            f"broker on {broker.bootstrap}; {len(schedule)} jobs from {args.trace.name} "
            f"({stats.total} rows skipped) on {cluster.name} ({cluster.total_gpus} GPUs), "
            f"policy {args.policy}, placer {args.placer}, "
            + ("lockstep" if args.lockstep else f"{args.speedup:g}x real time")
            + (
                f", rounds every {args.round_interval:g} s of trace time"
                if args.round_interval > 0
                else ", a round at every arrival and finish"
            )
            + f"; logs in {logs}; Ctrl-C stops",
            highlight=False,
        )
        # the trace's first submission is due now, on the replay's clock and on
        # cluster-sim's alike (however long the services take to start)
        args.epoch = time.time()
        procs = Services(settings, args, logs)
        try:
            procs.start()
            final = run_async(_up(settings, schedule, args, console, procs))
        finally:
            procs.stop()
    if args.json is not None and not args.until_done:
        write_json(final, args.json, sort_keys=True)
    if final.get("failed"):
        raise UserError(f"{final['failed']}; see {logs}")
    return 0


def run_local(args: argparse.Namespace) -> int:
    """`rltune up` with no trace: a local cluster of host agents that runs users' jobs."""
    given = [f"--{k.replace('_', '-')}" for k in REPLAY_ONLY if getattr(args, k) not in NOT_GIVEN]
    if given:
        raise UserError(
            f"{', '.join(given)} go with --trace (a replay); without it `up` runs a local "
            "cluster for the jobs users publish"
        )
    from services.placement.registry import OFFLOAD_SUFFIX, make_placer
    from services.scoring.policies import make_policy

    make_policy(args.policy)
    make_placer(args.placer)
    if OFFLOAD_SUFFIX in args.placer:
        raise UserError(
            f"--placer {args.placer} reads node bandwidths from a cluster file, which goes "
            "with --trace; the local cluster is its hosts as they report"
        )
    real = [] if args.hosts or args.gpus else _real_gpus()
    args.real_gpus = bool(real)
    if real:
        args.hosts, args.gpus, args.gpu_type = 1, len(real), real[0]
    else:
        args.hosts = args.hosts or LOCAL_HOSTS
        args.gpus = args.gpus or LOCAL_GPUS
    tenancy = _tenancy(args)
    console = Console(stderr=True)
    with _broker(args) as (broker, settings, logs):
        if tenancy is not None:  # the hosts, with the queues: scoring's cluster file
            args.local_cluster = logs / "cluster.yaml"
            args.local_cluster.write_text(yaml.safe_dump(tenancy, sort_keys=False))
        kind = "real GPUs (pynvml)" if real else "emulated GPUs"
        console.print(
            f"broker on {broker.bootstrap}; a local cluster of {args.hosts} host(s) x "
            f"{args.gpus} {kind} of type {args.gpu_type}, "
            f"policy {args.policy}, placer {args.placer}; "
            f"logs in {logs} (each job's output in {logs / 'jobs'}); Ctrl-C stops\n"
            "run a job:  rltune submit --job-id hello --num-gpus 1 "
            "--command 'python -c \"print(42)\"' --wait finished"
            + ("" if broker.bootstrap.endswith(":9092") else f" --bootstrap {broker.bootstrap}")
            + "\nlist jobs:  rltune jobs",
            highlight=False,
            soft_wrap=True,
        )
        procs = Services(settings, args, logs)
        try:
            procs.start()
            final = run_async(_up(settings, [], args, console, procs))
        finally:
            procs.stop()
    if final.get("failed"):
        raise UserError(f"{final['failed']}; see {logs}")
    return 0


def _tenancy(args: argparse.Namespace) -> dict[str, Any] | None:
    """The local cluster as a cluster file (its hosts, then `--queues`' queues and
    priority classes), checked as any cluster file is; None without `--queues`."""
    check_reclaim_args(args, live=True)
    if args.queues is None:
        if args.grace is not None or args.min_run is not None:
            raise UserError("--grace and --min-run go with --queues (the reclaim they tune)")
        return None
    try:
        raw = yaml.safe_load(args.queues.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read --queues {args.queues}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"--queues {args.queues} is not valid YAML") from exc
    keys = ("queues", "priority_classes")
    if not isinstance(raw, dict) or not raw or any(k not in keys for k in raw):
        raise UserError(f"--queues {args.queues}: a mapping of {' and '.join(keys)} only")
    data = {
        "name": "local",
        "nodes": [{"name": "host", "count": args.hosts, "gpu_type": args.gpu_type,
                   "gpus": args.gpus}],
        **raw,
    }  # fmt: skip
    parse_cluster(data, source=f"--queues {args.queues}")  # a bad file: one line, exit 2
    return data


@contextlib.contextmanager
def _broker(args: argparse.Namespace) -> Iterator[tuple[EmbeddedBroker, BusSettings, Path]]:
    """What both modes start with: the embedded broker on `--port` (or a free default),
    the deployment's topics on it, and the logs folder (`--logs`, or a fresh one)."""
    port = args.port if args.port is not None else _default_port()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="rltune-up-"))
    logs.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker(port, log_path=logs / "broker.log") as broker:
        settings = BusSettings.resolve(broker.bootstrap, args.topic_prefix)
        run_async(ensure_topics(settings))
        yield broker, settings, logs


def _real_gpus() -> list[str]:
    """The GPU type of each GPU pynvml sees here ([] without the NVIDIA driver)."""
    from offload_agent.launcher import _short_type, gpu_inventory

    return [_short_type(g.name) for g in gpu_inventory()]


def replay_jobs(args: argparse.Namespace, cluster: ClusterSpec, stats: SkipStats) -> list[TraceJob]:
    """The jobs the replay submits. Under `--offload-fraction` the ones cluster-sim
    marks (the same fraction, seed and function over the same jobs) declare their
    model size in their JobSpec, as a user submitting a 10Cache job does, so that
    placement's offload term sees a waiting job's own slowdown, not only once it runs."""
    from shared.sim.offload_jobs import load_marked

    return load_marked(
        args.trace, args.format, cluster, stats, args.limit, args.offload_fraction, args.seed
    )


def _default_port() -> int:
    import socket

    with socket.socket() as s:
        return 9092 if s.connect_ex(("127.0.0.1", 9092)) != 0 else free_port()


def _reclaim_args(args: argparse.Namespace) -> list[str]:
    """Scoring's cluster file (the local hosts and their queues) and reclaim settings."""
    path = getattr(args, "local_cluster", None)
    if path is None:
        return []
    out = ["--cluster", str(path)]
    out += ["--grace", repr(args.grace)] if args.grace is not None else []
    out += ["--min-run", repr(args.min_run)] if args.min_run is not None else []
    return out


class Services:
    """Every service as a child process (`rltune service NAME ...`)."""

    def __init__(self, settings: BusSettings, args: argparse.Namespace, logs: Path) -> None:
        self.logs = logs
        self.env: dict[str, dict[str, str]] = {}
        bus = ["--bootstrap", settings.bootstrap, "--topic-prefix", settings.topic_prefix]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        if args.trace is None:
            self._local(bus, args)
            return
        common = ["--cluster", str(args.cluster)]
        sim = ["--trace", str(args.trace), "--format", args.format, "--policy", args.policy]
        sim += ["--placer", args.placer, "--window", str(args.window), "--seed", str(args.seed)]
        sim += ["--discipline", args.discipline]
        sim += ["--speedup", str(args.speedup)] + (["--lockstep"] if args.lockstep else [])
        sim += ["--limit", str(args.limit)] if args.limit else []
        sim += ["--offload-fraction", str(args.offload_fraction)] if args.offload_fraction else []
        sim += ["--preempt"] if args.preempt else []
        sim += ["--round-interval", str(args.round_interval)] if args.round_interval else []
        sim += [] if args.lockstep else ["--epoch", repr(args.epoch)]
        sim += ["--no-reclaim"] if args.no_reclaim else []
        for flag, v in (("--grace", args.grace), ("--min-run", args.min_run),
                        ("--checkpoint", args.checkpoint)):  # fmt: skip
            sim += [flag, repr(v)] if v is not None else []
        if args.until_done:
            sim += ["--exit-when-done"]
            sim += ["--json", args.json] if args.json else []
            sim += ["--jobs-out", args.jobs_out] if args.jobs_out else []
        self.argv = {
            "arrival": [*bus, "--user-jobs", "reject", *common],
            "telemetry": bus,
            "scoring": bus + common + ["--policy", args.policy, "--rounds", "driven"]
            + ["--window", str(args.window), "--seed", str(args.seed)],
            "placement": bus + common + ["--placer", args.placer, "--discipline", args.discipline]
            + (["--reproducible"] if args.lockstep else []),
            "profiler": bus,
            "cluster-sim": bus + common + sim,
        }  # fmt: skip

    def _local(self, bus: list[str], args: argparse.Namespace) -> None:
        """The local cluster: the scheduler's services and one host agent per host (the
        cluster is the hosts as they report: no cluster file)."""
        self.argv = {
            "arrival": [*bus, *_reclaim_args(args)[:2]],  # (its cluster file's classes)
            "telemetry": bus,
            "scoring": [*bus, "--policy", args.policy, "--rounds", "free",
                        "--window", str(args.window), "--seed", str(args.seed),
                        *_reclaim_args(args)],
            "placement": [*bus, "--placer", args.placer, "--discipline", args.discipline],
            "profiler": bus,
        }  # fmt: skip
        for i in range(args.hosts):
            host = f"host-{i}"
            self.argv[host] = ["offload-agent", *bus]
            self.env[host] = {
                "RLTUNE_NODE_ID": host,
                "RLTUNE_NODE_GPUS": str(args.gpus),
                "RLTUNE_NODE_GPU_TYPE": args.gpu_type,
                # the host's GPUs as pynvml reports them (free, busy, memory), or the
                # emulated inventory
                "RLTUNE_NODE_EMULATE": "0" if getattr(args, "real_gpus", False) else "1",
                "RLTUNE_OFFLOAD_SOCKET": str(self.logs / f"{host}.sock"),
                "RLTUNE_SWAP_DIR": str(self.logs / "swap" / host),
                "RLTUNE_JOB_LOGS": str(self.logs / "jobs" / host),
            }

    def start(self) -> None:
        for name, argv in self.argv.items():
            log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
            self._logs.append(log)
            service = [] if name in self.env else [name]  # (an agent's argv names it)
            env = {**os.environ, **self.env[name]} if name in self.env else None
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "rltune", "service", *service, *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def failed(self) -> str | None:
        """Why the run cannot go on: a service that stopped by itself."""
        for name, p in self.procs.items():
            rc = p.poll()
            if rc is not None and not (name == "cluster-sim" and rc == 0):
                return f"service {name} stopped (exit {rc})"
        return None

    def sim_done(self) -> bool:
        p = self.procs.get("cluster-sim")
        return p is not None and p.poll() == 0

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs.values():
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self._logs:
            log.close()


@dataclass
class _Progress:
    total: int
    submitted: int = 0
    started: float = field(default_factory=time.monotonic)
    latest: dict[str, MetricsSnapshot] = field(default_factory=dict)
    rounds: list[tuple[float, float]] = field(default_factory=list)  # (wall, rounds)
    done_replay: bool = False
    replay_clock: float | None = None  # trace submit time of the last job published
    speedup: float = 0.0  # trace time per wall time (0: lockstep)
    live: str = ""  # the local cluster, when it runs users' jobs (no replay)

    def seen(self, snap: MetricsSnapshot) -> None:
        key = snap.source or snap.window
        self.latest[key] = snap
        if key == FIGURES:
            self.rounds.append((time.monotonic(), snap.counters.get("rounds", 0.0)))
            self.rounds = self.rounds[-10:]

    def lag(self) -> str:
        """How far the simulated cluster's clock (telemetry's latest event time) is
        behind the replay's, in trace time: the replay publishes each job at its
        submit time / speedup of wall time, while the cluster's clock loses what its
        rounds cannot keep up with, so slow rounds let jobs pile up `ahead` of it.
        Said only past what the snapshots' own age explains (telemetry publishes
        every second of wall time: `speedup` seconds of trace time, twice over)."""
        tel = self.latest.get(FIGURES)
        if tel is None or self.replay_clock is None or "clock_s" not in tel.counters:
            return ""
        behind = self.replay_clock - tel.counters["clock_s"]
        from services.telemetry.service import TelemetrySettings  # the interval `up` runs

        if behind <= max(60.0, 2 * TelemetrySettings.interval_s * self.speedup):
            return ""
        return f", cluster clock {behind / 3600:.1f} h behind the replay"

    def over(self) -> bool:
        """The replay is over: every job submitted, and telemetry counts each one ended
        with nothing waiting or running."""
        tel = self.latest.get(FIGURES)
        if not self.done_replay or tel is None:
            return False
        c = tel.counters
        idle = c.get("waiting", 0) == 0 and c.get("running", 0) == 0 and c.get("ahead", 0) == 0
        return idle and c.get("done", 0) >= self.submitted

    def head(self, sim_done: bool = False) -> str:
        """The view's title: what runs, for how long (wall time), and a replay's state."""
        wall = f"{time.monotonic() - self.started:.0f} s"
        if self.live:
            return f"{self.live}, up {wall}"
        if sim_done or self.over():
            return (
                f"replay over: all {self.submitted} jobs ended, {wall}; the cluster is idle "
                "(Ctrl-C stops)"
            )
        return f"replay {self.submitted}/{self.total} submitted, {wall}" + self.lag()

    def rounds_per_s(self) -> float:
        if len(self.rounds) < 2 or self.rounds[-1][0] <= self.rounds[0][0]:
            return 0.0
        (w0, r0), (w1, r1) = self.rounds[0], self.rounds[-1]
        return (r1 - r0) / (w1 - w0)


async def _up(
    settings: BusSettings,
    schedule: list[Paced],
    args: argparse.Namespace,
    console: Console,
    procs: Services,
) -> dict[str, Any]:
    stop = asyncio.Event()
    progress = _Progress(total=len(schedule), speedup=0.0 if args.lockstep else args.speedup)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watchers = [asyncio.create_task(_follow_metrics(settings, progress, stop))]
    if args.trace is not None:
        pace = 0.0 if args.lockstep else 1.0
        replay = _replay(settings, schedule, progress, stop, pace, args.epoch)
        watchers.append(asyncio.create_task(replay))
    else:
        progress.live = f"local cluster, {args.hosts} host(s) x {args.gpus} {args.gpu_type}"
    why = await _display(progress, stop, args.until_done, console, procs)
    stop.set()
    await asyncio.gather(*watchers, return_exceptions=True)
    final = _final(progress)
    if why:
        final["failed"] = why
    return final


async def _replay(
    settings: BusSettings,
    schedule: list[Paced],
    progress: _Progress,
    stop: asyncio.Event,
    pace: float,
    epoch: float | None = None,
) -> None:
    """Each job on `jobs.submit` at its time (all at once when `pace` is 0), carrying
    its trace submit time (the simulated cluster's clock). `epoch`: the wall-clock
    time (Unix s) the first job is due at (cluster-sim's too); default: now."""
    topic = settings.topics.jobs_submit
    async with Producer(settings, client_id="rltune-replay") as producer:
        t0 = time.monotonic() - (time.time() - epoch if epoch is not None else 0.0)
        for item in schedule:
            delay = t0 + item.at_s * pace - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
            if stop.is_set():
                break
            spec = job_spec_of(item.job)
            spec.submit_time = item.job.submit_s
            await producer.send(topic, spec.job_id, encode(spec), headers=REPLAY_HEADERS)
            progress.submitted += 1
            progress.replay_clock = item.job.submit_s
        await producer.flush()
    progress.done_replay = True


async def _follow_metrics(settings: BusSettings, progress: _Progress, stop: asyncio.Event) -> None:
    dec = msgspec.json.Decoder(MetricsSnapshot)
    c = AIOKafkaConsumer(**settings.client_kwargs(), enable_auto_commit=False)
    await c.start()
    try:
        parts = await partitions_of(c, [settings.topics.metrics])
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        while not stop.is_set():
            for msgs in (await c.getmany(timeout_ms=300)).values():
                for m in msgs:
                    with contextlib.suppress(msgspec.MsgspecError):
                        progress.seen(dec.decode(m.value or b""))
    finally:
        await c.stop()


def view(latest: dict[str, MetricsSnapshot], rounds_per_s: float, head: str = "") -> Group:
    """The operator's view of the latest snapshots (also `rltune metrics`)."""
    tel = latest.get(FIGURES)
    c = tel.counters if tel else {}
    win = next((s for k, s in latest.items() if k.startswith("telemetry.last")), None)
    t = Table(title=head or None, expand=True, show_header=False)
    t.add_column("what", no_wrap=True)
    t.add_column("value")
    ahead = c.get("ahead", 0)
    t.add_row(
        "jobs",
        f"waiting {c.get('waiting', 0):.0f}  running {c.get('running', 0):.0f}  "
        f"done {c.get('done', 0):.0f} (failed {c.get('failed', 0):.0f})"
        + (f"  submitted ahead of the cluster's clock {ahead:.0f}" if ahead else ""),
    )
    if tel:
        t.add_row(
            "JCT / queueing (all)",
            f"avg JCT {tel.avg_jct_s:,.0f} s  p99 {tel.p99_jct_s:,.0f} s  "
            f"avg queue {tel.avg_queue_s:,.0f} s  p99 {tel.p99_queue_s:,.0f} s  "
            f"bsld {tel.avg_bsld:.2f}",
        )
    if win:
        t.add_row(
            f"JCT / queueing ({win.window})",
            f"{win.jobs} jobs  avg JCT {win.avg_jct_s:,.0f} s  avg queue {win.avg_queue_s:,.0f} s",
        )
    util = "  ".join(f"{k[5:]} {v:.0%}" for k, v in sorted(c.items()) if k.startswith("util_"))
    t.add_row("utilisation now", util or "-")
    sim = latest.get("cluster-sim")
    rt = ""
    if sim is not None and "round_p50_ms" in sim.counters:
        rt = f"  round trip p50 {sim.counters['round_p50_ms']:.0f} ms"
    t.add_row(
        "rounds / placement",
        f"{c.get('rounds', 0):.0f} rounds  "
        + (f"{rounds_per_s:.1f}/s" if rounds_per_s > 0 else "none in the last seconds")
        + "  solve p50 "
        f"{c.get('placement_solve_p50_ms', 0):.1f} ms  p99 "
        f"{c.get('placement_solve_p99_ms', 0):.1f} ms" + rt,
    )
    rej = {k.split(".", 1)[-1]: v for k, v in (tel.rejected if tel else {}).items()}
    t.add_row(
        "rejections",
        f"{c.get('rejected_total', 0):.0f} "
        + " ".join(f"{k}={v}" for k, v in sorted(rej.items()))
        + f"  placement conflicts {c.get('rejected_placement', 0):.0f}",
    )
    if "offload_hit_rate" in c:
        t.add_row(
            "offload",
            f"hit rate {c['offload_hit_rate']:.1%}  migration p99 "
            f"{c.get('offload_migration_ms_p99', 0):.1f} ms over {c['offload_jobs']:.0f} jobs",
        )
    else:
        t.add_row("offload", "no offload.stats yet")
    services = Table.grid(padding=(0, 2))
    for name, snap in sorted(latest.items()):
        if name.startswith("telemetry."):
            continue
        n = snap.counters
        # a simulated cluster's offloading jobs run on the cost model in cluster-sim
        idle = name == "profiler" and not n.get("consumed", 0)
        note = "  (no profiles yet: host agents send them from training processes)"
        services.add_row(
            name,
            f"in {n.get('consumed', 0):.0f}  out {n.get('published', 0):.0f}  "
            f"rejected {n.get('rejected_total', 0):.0f}" + (note if idle else ""),
        )
    return Group(t, services)


def plain_figures(latest: dict[str, MetricsSnapshot], rounds_per_s: float) -> str:
    """The view's figures on one line (a log, or a pipe, not a screen)."""
    tel = latest.get(FIGURES)
    if tel is None:
        return "no figures from telemetry yet"
    c = tel.counters
    util = " ".join(f"{k[5:]} {v:.0%}" for k, v in sorted(c.items()) if k.startswith("util_"))
    rounds = f"{rounds_per_s:.1f} rounds/s" if rounds_per_s > 0 else "no round in the last seconds"
    return (
        f"waiting {c.get('waiting', 0):.0f} running {c.get('running', 0):.0f} "
        f"done {c.get('done', 0):.0f} (failed {c.get('failed', 0):.0f}) "
        f"ahead {c.get('ahead', 0):.0f}; avg JCT {tel.avg_jct_s:,.0f} s avg queue "
        f"{tel.avg_queue_s:,.0f} s over {tel.jobs} jobs; util {util or '-'}; "
        f"{c.get('rounds', 0):.0f} rounds, {rounds}; rejected {c.get('rejected_total', 0):.0f}"
    )


async def _display(
    progress: _Progress,
    stop: asyncio.Event,
    until_done: bool,
    console: Console,
    procs: Services,
) -> str | None:
    def finished() -> bool:
        if stop.is_set() or procs.failed():
            return True
        return until_done and procs.sim_done()

    def head() -> str:
        return progress.head(procs.sim_done())

    if console.is_terminal:
        with Live(
            view(progress.latest, 0.0, head()), console=console, refresh_per_second=4
        ) as live:
            while not finished():
                await asyncio.sleep(0.25)
                live.update(view(progress.latest, progress.rounds_per_s(), head()))
    else:  # a log, not a screen: one line of figures every few seconds
        last = 0.0
        while not finished():
            await asyncio.sleep(0.25)
            if time.monotonic() - last >= 5:
                last = time.monotonic()
                console.print(
                    f"{head()}; {plain_figures(progress.latest, progress.rounds_per_s())}",
                    highlight=False,
                    soft_wrap=True,
                )
        console.print(view(progress.latest, progress.rounds_per_s(), head()))
    return procs.failed()


def _final(progress: _Progress) -> dict[str, Any]:
    return {
        "submitted": progress.submitted,
        "sources": {k: msgspec.to_builtins(v) for k, v in sorted(progress.latest.items())},
    }
