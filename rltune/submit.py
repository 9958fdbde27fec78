"""`rltune submit`: publish JobSpecs to `jobs.submit`, from flags or a JSON-lines file
(or, with `--kill JOB_ID`, a `KillRequest` on `jobs.kill`: the host agent running
the job stops it).

Each spec is checked here with the same decoder the arrival service uses, so a
mistake is reported at once (file, line, reason); only valid specs are sent.
`--wait` then waits for the arrival service's answer to each one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from rltune.common import add_bus_args, bus_settings, positive_float, run_async, unreachable
from services.arrival.admission import decode_spec
from shared.bus import SRC_HEADER, Producer, partitions_of
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import JobSpec, KillRequest, Rejection, encode
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
    p.add_argument("--weight", type=float, default=1.0)
    p.add_argument("--project", default="", help="group / account (Slurm's account)")
    p.add_argument("--app", default="", help="executable or job name")
    p.add_argument(
        "--time-limit", type=float, default=None, help="requested wall time, seconds (--time)"
    )
    p.add_argument("--kill", metavar="JOB_ID", help="ask the host running JOB_ID to stop it")
    p.add_argument("--reason", default="", help="why (with --kill; reported in its event)")
    p.add_argument("--wait", action="store_true", help="wait for each job's accept/reject")
    p.add_argument(
        "--timeout", type=positive_float, default=30.0, help="seconds to --wait (default 30)"
    )
    add_bus_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.kill is not None:
        return _kill(args)
    specs, errors = _specs_from_args(args)
    for e in errors:
        print(e, file=sys.stderr)
    if not specs:
        raise UserError("nothing to submit" + (" (every spec was invalid)" if errors else ""))
    settings = bus_settings(args)
    answers = run_async(_publish(settings, specs, args.wait, args.timeout))
    print(f"submitted {len(specs)} job(s) to {settings.topics.jobs_submit}")
    if args.wait:
        _print_answers(specs, answers)
        if any(a is None or isinstance(a, Rejection) for a in answers.values()):
            return 1
    return 1 if errors else 0


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

    run_async(send())
    print(f"asked to kill {req.job_id} on {settings.topics.jobs_kill}")
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


async def _publish(
    settings: BusSettings, specs: list[JobSpec], wait: bool, timeout_s: float
) -> dict[str, object]:
    """Send the specs; with `wait`, the answer to each of these very messages (matched by
    the position each was written at, which every answer names in its SRC_HEADER)."""
    t = settings.topics
    consumer = AIOKafkaConsumer(**settings.client_kwargs()) if wait else None
    try:
        try:
            if consumer is not None:  # positions read before sending: answers come after
                await consumer.start()
                parts = await partitions_of(consumer, [t.jobs_accepted, t.jobs_rejected])
                consumer.assign(parts)
                for tp, end in (await consumer.end_offsets(parts)).items():
                    consumer.seek(tp, end)
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
            return {}
        # "|<topic>:<partition>:<offset>@" of each message sent -> its job id
        mine = {
            f"|{t.jobs_submit}:{r.partition}:{r.offset}@".encode(): s.job_id  # type: ignore[attr-defined]
            for s, r in zip(specs, results, strict=True)
        }
        return await _collect(consumer, settings, mine, timeout_s)
    finally:
        if consumer is not None:
            await _stop_quietly(consumer)


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
    consumer: AIOKafkaConsumer, settings: BusSettings, mine: dict[bytes, str], timeout_s: float
) -> dict[str, object]:
    """Until every message in `mine` has its answer, or `timeout_s`."""
    answers: dict[str, object] = dict.fromkeys(mine.values())
    rej_dec = msgspec.json.Decoder(Rejection)
    deadline = time.monotonic() + timeout_s
    pending = dict(mine)
    while pending and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=200)
        for tp, msgs in batch.items():
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
