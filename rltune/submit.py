"""`rltune submit`: publish JobSpecs to `jobs.submit`, from flags or a JSON-lines file
(or, with `--kill JOB_ID`, a `KillRequest` on `jobs.kill`: scoring takes a waiting job
out of the queue (`cancelled`), the host agent running it stops a running one
(`failed`, "killed on request")).

Each spec is checked here with the same decoder the arrival service uses, so a
mistake is reported at once (file, line, reason); only valid specs are sent.
`--wait` then waits for the arrival service's answer to each one; `--wait finished`
follows each job to its end as `sbatch --wait` does, printing every event
(accepted, started on which nodes, finished / failed / cancelled), and exits with
the job's status: 0 when every job finished, else the exit code of a single failed
job's command (1 when it has none, or for several jobs). `--kill JOB_ID --wait`
waits for the killed job's last event.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from rltune.common import add_bus_args, bus_settings, positive_float, run_async, unreachable
from services.arrival.admission import decode_spec
from shared.bus import SRC_HEADER, Producer, partitions_of
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import JobEvent, JobSpec, KillRequest, Rejection, encode
from shared.reject import Reject


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="publish JobSpecs to jobs.submit")
    p.add_argument("--file", type=Path, help="JSON lines, one JobSpec per line ('-' = stdin)")
    p.add_argument("--job-id")
    p.add_argument("--num-gpus", type=int)
    p.add_argument("--user", default="")
    p.add_argument("--vc", default="")
    p.add_argument("--gpu-types", default="", help="comma-separated allowed GPU types")
    p.add_argument("--gpu-milli", type=int, default=1000)
    p.add_argument("--model", default="")
    p.add_argument("--duration-hint", type=float, default=None, help="seconds")
    p.add_argument(
        "--command",
        default=None,
        metavar="CMD",
        help="the command a host runs for the job, split as a shell would "
        '(e.g. "python train.py --epochs 3"); no shell runs it',
    )
    p.add_argument("--weight", type=float, default=1.0)
    p.add_argument("--project", default="", help="group / account (Slurm's account)")
    p.add_argument("--app", default="", help="executable or job name")
    p.add_argument(
        "--time-limit", type=float, default=None, help="requested wall time, seconds (--time)"
    )
    p.add_argument("--kill", metavar="JOB_ID", help="ask the host running JOB_ID to stop it")
    p.add_argument("--reason", default="", help="why (with --kill; reported in its event)")
    p.add_argument(
        "--wait",
        nargs="?",
        const="accepted",
        default=None,
        choices=WAITS,
        help="wait for each job's accept/reject (--wait), or follow it to its end and exit "
        "with its status (--wait finished); with --kill, wait for the job's last event",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        help="seconds to --wait (default 30; no limit for --wait finished)",
    )
    add_bus_args(p)
    p.set_defaults(func=run)


WAITS = ("accepted", "finished")
ENDS = frozenset({"finished", "failed", "cancelled"})


def run(args: argparse.Namespace) -> int:
    if args.kill is not None:
        return _kill(args)
    specs, errors = _specs_from_args(args)
    for e in errors:
        print(e, file=sys.stderr)
    if not specs:
        raise UserError("nothing to submit" + (" (every spec was invalid)" if errors else ""))
    settings = bus_settings(args)
    follow = args.wait == "finished"
    timeout = args.timeout if args.timeout is not None else (None if follow else 30.0)
    answers, ends = run_async(_publish(settings, specs, args.wait is not None, timeout, follow))
    if not follow:
        print(f"submitted {len(specs)} job(s) to {settings.topics.jobs_submit}")
    if args.wait is None:
        return 1 if errors else 0
    if not follow:
        _print_answers(specs, answers)
    if any(a is None or isinstance(a, Rejection) for a in answers.values()):
        return 1
    if follow:
        return _status(specs, ends, timeout)
    return 1 if errors else 0


def _status(specs: list[JobSpec], ends: dict[str, JobEvent], timeout: float | None) -> int:
    """`--wait finished`'s exit status (module docstring)."""
    missing = [s.job_id for s in specs if s.job_id not in ends]
    if missing:
        print(f"{', '.join(missing)}: not ended after {timeout:g} s", file=sys.stderr)
        return 1
    if all(e.kind == "finished" for e in ends.values()):
        return 0
    if len(specs) == 1:
        code = ends[specs[0].job_id].exit_code
        if code is not None and 0 < code < 256:
            return code
    return 1


def _kill(args: argparse.Namespace) -> int:
    raw = encode(KillRequest(args.kill, args.reason))
    try:
        req = msgspec.json.decode(raw, type=KillRequest)  # the pattern and length checks
    except msgspec.ValidationError as exc:
        raise UserError(f"--kill {args.kill!r}: {exc}") from None
    settings = bus_settings(args)

    async def send() -> None:
        try:
            async with Producer(settings, client_id="rltune-submit") as p:
                await (await p.send(settings.topics.jobs_kill, req.job_id, encode(req)))
        except (KafkaError, OSError) as exc:
            raise unreachable(settings, exc) from None

    if args.wait is None:
        run_async(send())
        print(f"asked to kill {req.job_id} on {settings.topics.jobs_kill}")
        return 0
    timeout = args.timeout if args.timeout is not None else 30.0

    async def send_and_wait() -> JobEvent | None:
        consumer = AIOKafkaConsumer(**settings.client_kwargs())
        try:
            try:
                await _from_end(consumer, [settings.topics.jobs_events])
                await send()
            except (KafkaError, OSError) as exc:
                raise unreachable(settings, exc) from None
            ends = await _follow(consumer, settings, {req.job_id}, timeout)
            return ends.get(req.job_id)
        finally:
            await _stop_quietly(consumer)

    print(f"asked to kill {req.job_id} on {settings.topics.jobs_kill}")
    if run_async(send_and_wait()) is None:
        print(
            f"{req.job_id}: no answer in {timeout:g} s (not submitted, already ended, or "
            "scoring and the host agents are not running)",
            file=sys.stderr,
        )
        return 1
    return 0


def _specs_from_args(args: argparse.Namespace) -> tuple[list[JobSpec], list[str]]:
    if args.file is not None:
        return _specs_from_file(args.file)
    if args.job_id is None or args.num_gpus is None:
        raise UserError("give --file, or at least --job-id and --num-gpus")
    raw = {
        "job_id": args.job_id,
        "num_gpus": args.num_gpus,
        "user": args.user,
        "vc": args.vc,
        "gpu_types": [t for t in args.gpu_types.split(",") if t],
        "gpu_milli": args.gpu_milli,
        "model": args.model,
        "weight": args.weight,
    }
    if args.duration_hint is not None:
        raw["duration_hint_s"] = args.duration_hint
    if args.command is not None:
        try:
            raw["command"] = shlex.split(args.command)
        except ValueError as exc:
            raise UserError(f"--command {args.command!r}: {exc}") from None
        if not raw["command"]:
            raise UserError("--command is empty")
    if args.project:
        raw["project"] = args.project
    if args.app:
        raw["app"] = args.app
    if args.time_limit is not None:
        raw["time_limit_s"] = args.time_limit
    try:
        return [decode_spec(msgspec.json.encode(raw))], []
    except Reject as rej:
        raise UserError(rej.reason) from None


def _specs_from_file(path: Path) -> tuple[list[JobSpec], list[str]]:
    try:
        lines = sys.stdin.buffer.readlines() if str(path) == "-" else path.read_bytes().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    specs: list[JobSpec] = []
    errors: list[str] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            specs.append(decode_spec(line))
        except Reject as rej:
            errors.append(f"{path}:{n}: {rej.reason}")
    return specs, errors


async def _from_end(consumer: AIOKafkaConsumer, topics: list[str]) -> None:
    """Start `consumer` on `topics` at their current ends: what it reads comes after."""
    await consumer.start()
    parts = await partitions_of(consumer, topics)
    consumer.assign(parts)
    for tp, end in (await consumer.end_offsets(parts)).items():
        consumer.seek(tp, end)


async def _publish(
    settings: BusSettings,
    specs: list[JobSpec],
    wait: bool,
    timeout_s: float | None,
    follow: bool = False,
) -> tuple[dict[str, object], dict[str, JobEvent]]:
    """Send the specs; with `wait`, the answer to each of these very messages (matched by
    the position each was written at, which every answer names in its SRC_HEADER); with
    `follow`, also each accepted job's events, printed as they come, to its last one."""
    t = settings.topics
    consumer = AIOKafkaConsumer(**settings.client_kwargs()) if wait else None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        try:
            if consumer is not None:  # positions read before sending: answers come after
                topics = [t.jobs_accepted, t.jobs_rejected] + ([t.jobs_events] if follow else [])
                await _from_end(consumer, topics)
            async with Producer(settings, client_id="rltune-submit") as producer:
                futs = [await producer.send(t.jobs_submit, s.job_id, encode(s)) for s in specs]
                results = await asyncio.gather(*futs, return_exceptions=True)
        except (KafkaError, OSError) as exc:
            raise unreachable(settings, exc) from None
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise UserError(
                f"sent {len(results) - len(failed)} of {len(specs)} job(s) to {t.jobs_submit}; "
                f"the broker did not take the rest ({type(failed[0]).__name__}: {failed[0]})"
            )
        if consumer is None:
            return {}, {}
        if follow:
            for s in specs:
                print(f"{_clock()} {s.job_id}: submitted to {t.jobs_submit}", flush=True)
        # "|<topic>:<partition>:<offset>@" of each message sent -> its job id
        mine = {
            f"|{t.jobs_submit}:{r.partition}:{r.offset}@".encode(): s.job_id  # type: ignore[attr-defined]
            for s, r in zip(specs, results, strict=True)
        }
        events: list[JobEvent] = []
        answers = await _collect(consumer, settings, mine, timeout_s, events if follow else None)
        if not follow:
            return answers, {}
        accepted = {j for j, a in answers.items() if a == "accepted"}
        for j, a in answers.items():
            if isinstance(a, Rejection):
                print(f"{_clock()} {j}: rejected: {a.reason}", flush=True)
            elif a is None:
                print(f"{_clock()} {j}: no answer (is the arrival service running?)")
        ends: dict[str, JobEvent] = {}
        for ev in events:  # (events read while the answers were awaited)
            _show(ev, accepted, ends)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if accepted - set(ends):
            ends.update(await _follow(consumer, settings, accepted - set(ends), left))
        return answers, ends
    finally:
        if consumer is not None:
            await _stop_quietly(consumer)


def _clock(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t).strftime("%H:%M:%S")


def _show(ev: JobEvent, jobs: set[str], ends: dict[str, JobEvent]) -> None:
    """Print one of `jobs`' events (the job's end goes into `ends`)."""
    if ev.job_id not in jobs or ev.job_id in ends:
        return
    where = f" on {', '.join(ev.node_ids)}" if ev.node_ids else ""
    detail = f" ({ev.detail})" if ev.detail else ""
    if ev.kind == "started":
        text = f"started{where}{detail}"
    elif ev.kind == "rejected_placement":
        text = f"placement refused{where}, back in the queue{detail}"
    else:
        text = f"{ev.kind}{where}{detail}"
    print(f"{_clock(ev.time)} {ev.job_id}: {text}", flush=True)
    if ev.kind in ENDS:
        ends[ev.job_id] = ev


async def _follow(
    consumer: AIOKafkaConsumer, settings: BusSettings, jobs: set[str], timeout_s: float | None
) -> dict[str, JobEvent]:
    """Print `jobs`' events from `jobs.events` until each has ended, or `timeout_s`."""
    dec = msgspec.json.Decoder(JobEvent)
    ends: dict[str, JobEvent] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while jobs - set(ends) and (deadline is None or time.monotonic() < deadline):
        for tp, msgs in (await consumer.getmany(timeout_ms=200)).items():
            if tp.topic != settings.topics.jobs_events:
                continue
            for m in msgs:
                try:
                    _show(dec.decode(m.value or b""), jobs, ends)
                except msgspec.MsgspecError:
                    continue
    return ends


async def _stop_quietly(consumer: AIOKafkaConsumer) -> None:
    """Stop the consumer whatever state the broker left it in. With the broker gone,
    aiokafka's fetcher can end its own cancelled fetch task by re-raising
    CancelledError out of `stop()`: swallowed here unless this task itself is being
    cancelled (then it goes on up, as it must)."""
    try:
        await consumer.stop()
    except Exception:
        pass
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


async def _collect(
    consumer: AIOKafkaConsumer,
    settings: BusSettings,
    mine: dict[bytes, str],
    timeout_s: float | None,
    events: list[JobEvent] | None = None,
) -> dict[str, object]:
    """Until every message in `mine` has its answer, or `timeout_s`; `jobs.events`
    records read meanwhile are kept in `events` (a job can start as it is accepted)."""
    answers: dict[str, object] = dict.fromkeys(mine.values())
    rej_dec = msgspec.json.Decoder(Rejection)
    ev_dec = msgspec.json.Decoder(JobEvent)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending = dict(mine)
    while pending and (deadline is None or time.monotonic() < deadline):
        batch = await consumer.getmany(timeout_ms=200)
        for tp, msgs in batch.items():
            if tp.topic == settings.topics.jobs_events:
                if events is not None:
                    for m in msgs:
                        try:
                            events.append(ev_dec.decode(m.value or b""))
                        except msgspec.MsgspecError:
                            continue
                continue
            for m in msgs:
                src = dict(m.headers or ()).get(SRC_HEADER, b"")
                at = src.find(b"|")
                job_id = pending.pop(src[at : src.find(b"@", at) + 1], None) if at >= 0 else None
                if job_id is None:
                    continue
                if tp.topic == settings.topics.jobs_rejected:
                    try:
                        answers[job_id] = rej_dec.decode(m.value)
                    except msgspec.MsgspecError:
                        answers[job_id] = Rejection(job_id, "(unreadable rejection)", "")
                else:
                    answers[job_id] = "accepted"
                    if events is not None:
                        print(f"{_clock(m.timestamp / 1000)} {job_id}: accepted", flush=True)
    return answers


def _print_answers(specs: list[JobSpec], answers: dict[str, object]) -> None:
    for s in specs:
        a = answers.get(s.job_id)
        if a is None:
            print(f"{s.job_id}: no answer (is the arrival service running?)")
        elif isinstance(a, Rejection):
            print(f"{s.job_id}: rejected: {a.reason}")
        else:
            print(f"{s.job_id}: accepted")
