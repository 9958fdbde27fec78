"""`rltune submit`: publish JobSpecs to `jobs.submit`, from flags or a JSON-lines file.

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

from services.arrival.admission import decode_spec
from shared.bus import Producer
from shared.cli.common import add_bus_args, bus_settings, run_async
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import JobSpec, Rejection, encode
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
    p.add_argument("--wait", action="store_true", help="wait for each job's accept/reject")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to --wait (default 30)")
    add_bus_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
    t = settings.topics
    consumer = None
    if wait:
        consumer = AIOKafkaConsumer(
            t.jobs_accepted, t.jobs_rejected, bootstrap_servers=settings.bootstrap
        )
        await consumer.start()
        await consumer.seek_to_end()
        for tp in consumer.assignment():  # pin the start before anything is sent
            await consumer.position(tp)
    try:
        async with Producer(settings, client_id="rltune-submit") as producer:
            futs = [await producer.send(t.jobs_submit, s.job_id, encode(s)) for s in specs]
            await asyncio.gather(*futs)
        if consumer is None:
            return {}
        return await _collect(consumer, settings, {s.job_id for s in specs}, timeout_s)
    finally:
        if consumer is not None:
            await consumer.stop()


async def _collect(
    consumer: AIOKafkaConsumer, settings: BusSettings, ids: set[str], timeout_s: float
) -> dict[str, object]:
    answers: dict[str, object] = dict.fromkeys(ids)
    rej_dec = msgspec.json.Decoder(Rejection)
    deadline = time.monotonic() + timeout_s
    pending = set(ids)
    while pending and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=200)
        for tp, msgs in batch.items():
            for m in msgs:
                key = (m.key or b"").decode("utf-8", "replace")
                if key not in pending:
                    continue
                pending.discard(key)
                if tp.topic == settings.topics.jobs_rejected:
                    answers[key] = rej_dec.decode(m.value)
                else:
                    answers[key] = "accepted"
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
