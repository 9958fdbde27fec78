"""Soak test of the bus: mixed valid and hostile messages on `jobs.submit` and
`offload.profiles`, through broker restarts and a SIGKILL of each service.

    .venv/bin/python -m tests.integration.soak --messages 50000 [--json OUT]

Loopback only: the embedded broker and `rltune service arrival` / `rltune service
profiler` as child processes. The run is cut into epochs, one more than the broker
restarts. In each epoch the driver publishes its share of the messages in chunks; in
the middle of the stream it SIGKILLs one service and starts it again (what a
supervisor does); once every input of the epoch is answered it restarts the broker.

The embedded broker keeps nothing across a restart (memory storage): each restart
brings back an empty cluster, as if the data had been lost. So restarts happen
between epochs, with every input of the epoch answered, and each epoch has job ids
of its own (a job accepted before the wipe is no longer on record after it).
Within an epoch, checked against the pure admission logic run a second time:

* every input answered exactly once (accepted, rejected or dead-lettered), counted
  by the input's fingerprint in the answers' source header;
* every valid job id accepted exactly once, every duplicate of a live id rejected;
* at the end, every service still running (and it exits 0 on SIGTERM).

Bounded: every wait has a deadline; a stuck run fails with what it was waiting for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaProducer

from services.arrival.admission import Admission
from shared.broker import EmbeddedBroker, ensure_topics, free_port
from shared.bus import MAX_MESSAGE_BYTES, SRC_HEADER, Record, read_back
from shared.config import BusSettings
from shared.messages import TensorProfile, encode
from shared.reject import Reject
from tests.integration.arrival_load import hypothesis_garbage, valid_specs

SERVICES = ("arrival", "profiler")


@dataclass
class Epoch:
    """One stretch between broker restarts: what went in, and what came out."""

    inputs: int = 0
    answered_once: int = 0
    unanswered: int = 0
    answered_twice: int = 0
    accepted: int = 0
    accepted_twice: int = 0
    rejected: int = 0
    plans: int = 0
    dead_letters: int = 0
    killed: str = ""
    answered_at_kill: int = 0  # of the inputs sent before the kill
    seconds: float = 0.0


@dataclass
class Report:
    messages: int
    restarts: int
    seed: int
    epochs: list[Epoch] = field(default_factory=list)
    unready_while_broker_down: list[dict[str, bool]] = field(default_factory=list)
    ready_after_restart: list[dict[str, bool]] = field(default_factory=list)
    services_running_at_end: dict[str, bool] = field(default_factory=dict)
    outage_lines: dict[str, int] = field(default_factory=dict)  # "unreachable" lines
    tracebacks: dict[str, int] = field(default_factory=dict)
    clean_exit: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            all(
                e.unanswered == 0 and e.answered_twice == 0 and e.accepted_twice == 0
                for e in self.epochs
            )
            and all(self.services_running_at_end.values())
            and all(all(d.values()) for d in self.unready_while_broker_down)
            and all(all(d.values()) for d in self.ready_after_restart)
            and not any(self.tracebacks.values())
            and all(code == 0 for code in self.clean_exit.values())
        )


def _hostile_extras(tag: str) -> list[bytes]:
    """Messages aimed at the holes the bus once had: sizes, escapes, nesting, encodings."""
    return [
        b"\x01" * 200_000,  # six times larger once escaped
        b'{"job_id": "' + tag.encode() + b'-big", "num_gpus": 1, "pad": "' + b"x" * 1100000 + b'"}',
        b'{"job_id": "' + tag.encode() + b'-nl\\n", "num_gpus": 1}',
        b'{"job_id": "' + tag.encode() + b'-deep", "num_gpus": 1, "x": ' + b"[" * 2000 + b"]" * 2000
        + b"}",
        b'{"job_id": "' + tag.encode() + b'-utf", "num_gpus": 1, "user": "\xff\xfe"}',
        b'{"job_id": "' + tag.encode() + b'-utf2", "num_gpus": 1, "zz": "\xc3"}',
        b"",
        b"\xff" * 5000,
    ]  # fmt: skip


def _profile(job_id: str, rng: random.Random) -> bytes:
    n = rng.randint(2, 12)
    tensors = [(f"t{i}", 4096 * rng.randint(1, 64), "float32", "param") for i in range(n)]
    total = sum(t[1] for t in tensors)
    return encode(
        TensorProfile(
            job_id=job_id,
            tensors=tensors,
            order=[t[0] for t in tensors],
            fast_budget_bytes=total,
            host_budget_bytes=total,
        )
    )


def epoch_load(n: int, tag: str, seed: int) -> list[tuple[str, bytes]]:
    """About `n` (topic suffix, value) pairs: three quarters for jobs.submit (valid specs,
    duplicates of live ids, garbage), a quarter for offload.profiles (valid, garbage)."""
    rng = random.Random(seed)
    n_profiles = n // 4
    n_jobs = n - n_profiles
    n_valid = n_jobs // 2
    valid = [s.replace(b'"job-', f'"{tag}-job-'.encode()) for s in valid_specs(n_valid, seed)]
    extras = _hostile_extras(tag)
    garbage = list(hypothesis_garbage(max(n_jobs - n_valid - n_valid // 10 - len(extras), 1), 0))
    jobs = valid + garbage + extras
    rng.shuffle(jobs)
    for i in rng.sample(range(n_valid), n_valid // 10):  # a duplicate after its original
        pos = jobs.index(valid[i])
        jobs.insert(rng.randint(pos + 1, len(jobs)), valid[i])
    profiles = [
        _profile(f"{tag}-p{i}", rng) if rng.random() < 0.6 else rng.randbytes(rng.randint(0, 300))
        for i in range(n_profiles)
    ]
    out = [("jobs.submit", m) for m in jobs] + [("offload.profiles", m) for m in profiles]
    rng.shuffle(out)
    return out


def _expected_accepted(load: list[tuple[str, bytes]]) -> Counter[str]:
    """The job ids the pure admission logic accepts, in publication order."""
    a = Admission()
    ids: Counter[str] = Counter()
    for topic, m in load:
        if topic != "jobs.submit" or len(m) > MAX_MESSAGE_BYTES:  # refused unread
            continue
        with contextlib.suppress(Reject):
            ids[a.admit(m, 0.0).job_id] += 1
    return ids


def _fingerprint(ts: int, key: bytes | None, value: bytes) -> str:
    crc = zlib.crc32(value, zlib.crc32(key or b""))
    return f"{ts & 0xFFFFFFFFFFFF:x}.{crc:08x}"


class Soak:
    def __init__(
        self,
        messages: int,
        restarts: int,
        seed: int,
        log_dir: Path,
        kills: list[list[str]] | None = None,
    ) -> None:
        """`kills`: the services to SIGKILL in each epoch (default: one per epoch, in
        the order of SERVICES, until each was killed once)."""
        self.messages, self.restarts, self.seed = messages, restarts, seed
        self.kills = kills or [[name] for name in SERVICES]
        self.log_dir = log_dir
        self.broker = EmbeddedBroker(free_port(), log_path=log_dir / "broker.log")
        self.settings = BusSettings(self.broker.bootstrap, "soak.")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports = {name: free_port() for name in SERVICES}  # /metrics, /healthz, /readyz
        self.report = Report(messages, restarts, seed)
        self._ts = int(time.time() * 1000)

    # ---- services ----

    def start_service(self, name: str) -> None:
        env = dict(
            os.environ,
            RLTUNE_BOOTSTRAP_SERVERS=self.settings.bootstrap,
            RLTUNE_TOPIC_PREFIX=self.settings.topic_prefix,
            RLTUNE_PLAN_BUDGET_S="10",
        )
        err = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.procs[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rltune",
                "service",
                name,
                "--prometheus-port",
                str(self.ports[name]),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        err.close()

    def kill_and_restart(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise AssertionError(f"{name} had already exited ({proc.returncode})")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        self.start_service(name)

    # ---- publishing and checking ----

    async def publish(self, load: list[tuple[str, bytes]]) -> list[str]:
        """Publish with distinct timestamps; the fingerprint of each input."""
        p = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap, max_request_size=4 << 20, linger_ms=5
        )
        await p.start()
        fps = []
        try:
            futs = []
            for topic, value in load:
                self._ts += 1
                key = _key_of(value)
                futs.append(
                    await p.send(
                        self.settings.topic_prefix + topic, value, key=key, timestamp_ms=self._ts
                    )
                )
                fps.append(_fingerprint(self._ts, key, value))
            await asyncio.gather(*futs)
        finally:
            await p.stop()
        return fps

    async def answers(self) -> tuple[Counter[str], Counter[str], Counter[str]]:
        """Answers per input fingerprint, accepted job ids, and answers per topic."""
        t = self.settings.topics
        by_input: Counter[str] = Counter()
        accepted: Counter[str] = Counter()
        per_topic: Counter[str] = Counter()
        dec = msgspec.json.Decoder(dict)

        def on(rec: Record) -> None:
            src = rec.header(SRC_HEADER) or b""
            if b"@" in src:
                by_input[src.rsplit(b"@", 1)[1].decode()] += 1
            per_topic[rec.topic] += 1
            if rec.topic == t.jobs_accepted:
                accepted[dec.decode(rec.value or b"{}")["job_id"]] += 1

        topics = [
            t.jobs_accepted,
            t.jobs_rejected,
            t.offload_plans,
            t.dead_letter(t.offload_profiles),
        ]
        await read_back(self.settings, topics, on)
        return by_input, accepted, per_topic

    async def wait_some(self, n: int, timeout_s: float) -> int:
        """Until at least `n` answers are out; how many there are."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            by_input, _, _ = await self.answers()
            if sum(by_input.values()) >= n:
                return sum(by_input.values())
            await asyncio.sleep(0.2)
        raise AssertionError(f"fewer than {n} answers after {timeout_s} s")

    async def wait_answered(self, fps: list[str], timeout_s: float) -> None:
        """Until every input has an answer and nothing more came for 2 s."""
        deadline = time.monotonic() + timeout_s
        want = set(fps)
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited ({proc.returncode}); see its log")
            by_input, _, _ = await self.answers()
            total = sum(by_input.values())
            if total != last:
                last, since = total, time.monotonic()
            if want <= set(by_input) and time.monotonic() - since >= 2.0:
                return
            await asyncio.sleep(1.0)
        by_input, _, _ = await self.answers()
        missing = len(want - set(by_input))
        raise AssertionError(f"{missing} of {len(want)} inputs unanswered after {timeout_s} s")

    async def epoch(self, index: int, load: list[tuple[str, bytes]], kill: list[str]) -> Epoch:
        t0 = time.monotonic()
        half = len(load) // 2
        fps = await self.publish(load[:half])
        at_kill = 0
        if kill:  # mid-stream: once a tenth of what was sent is answered
            at_kill = await self.wait_some(len(fps) // 10, timeout_s=120)
            for name in kill:
                self.kill_and_restart(name)
        fps += await self.publish(load[half:])
        await self.wait_answered(fps, timeout_s=120 + len(load) / 100)
        by_input, accepted, per_topic = await self.answers()
        want = _expected_accepted(load)
        t = self.settings.topics
        e = Epoch(
            inputs=len(fps),
            answered_once=sum(1 for f in fps if by_input[f] == 1),
            unanswered=sum(1 for f in fps if by_input[f] == 0),
            answered_twice=sum(1 for f in fps if by_input[f] > 1),
            accepted=sum(accepted.values()),
            accepted_twice=sum(1 for c in accepted.values() if c > 1),
            rejected=per_topic[t.jobs_rejected],
            plans=per_topic[t.offload_plans],
            dead_letters=per_topic[t.dead_letter(t.offload_profiles)],
            killed=",".join(kill),
            answered_at_kill=at_kill,
            seconds=round(time.monotonic() - t0, 1),
        )
        if accepted != want:
            diff = (accepted - want) + (want - accepted)
            some = dict(list(diff.items())[:5])
            raise AssertionError(f"epoch {index}: accepted ids differ from the oracle's: {some}")
        return e

    async def readiness(self, want: int, timeout_s: float) -> dict[str, bool]:
        """Whether each service's /readyz answered `want` within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        seen = dict.fromkeys(SERVICES, False)
        while time.monotonic() < deadline and not all(seen.values()):
            for name in SERVICES:
                url = f"http://127.0.0.1:{self.ports[name]}/readyz"
                seen[name] = seen[name] or await asyncio.to_thread(_status, url) == want
            await asyncio.sleep(0.3)
        return seen

    async def restart_broker(self) -> None:
        await asyncio.to_thread(self.broker.stop)
        self.report.unready_while_broker_down.append(await self.readiness(503, 30))
        await asyncio.to_thread(self.broker.start)
        await ensure_topics(self.settings)

    async def run(self, progress: bool = True) -> Report:
        t0 = time.monotonic()
        await asyncio.to_thread(self.broker.start)
        try:
            await ensure_topics(self.settings)
            for name in SERVICES:
                self.start_service(name)
            epochs = self.restarts + 1
            kills = self.kills + [[]] * epochs
            sizes = [self.messages // epochs + (self.messages % epochs if i == 0 else 0)
                     for i in range(epochs)]  # fmt: skip
            loads = await asyncio.to_thread(  # while the services start
                lambda: [epoch_load(n, f"e{i}", self.seed + i) for i, n in enumerate(sizes)]
            )
            for i in range(epochs):
                e = await self.epoch(i, loads[i], kills[i])
                self.report.epochs.append(e)
                if progress:
                    print(f"epoch {i}: {json.dumps(asdict(e))}", file=sys.stderr)
                if i > 0:  # answered all since the restart: connected again
                    self.report.ready_after_restart.append(await self.readiness(200, 60))
                if i < self.restarts:
                    await self.restart_broker()
            self.report.services_running_at_end = {
                n: p.poll() is None for n, p in self.procs.items()
            }
        finally:
            for name, proc in self.procs.items():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                try:
                    self.report.clean_exit[name] = proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    self.report.clean_exit[name] = proc.wait(10)
            await asyncio.to_thread(self.broker.stop)
        for name in SERVICES:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace")
            self.report.outage_lines[name] = text.count("Kafka broker unreachable")
            self.report.tracebacks[name] = text.count("Traceback")
        self.report.seconds = round(time.monotonic() - t0, 1)
        return self.report


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _key_of(value: bytes) -> bytes | None:
    """The job id as key, when the message has a usable one (as `rltune submit` does)."""
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        return None
    jid = obj.get("job_id") if isinstance(obj, dict) else None
    return jid.encode() if isinstance(jid, str) else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--restarts", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the report as JSON here")
    p.add_argument("--log-dir", type=Path, default=Path("soak-logs"))
    args = p.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(Soak(args.messages, args.restarts, args.seed, args.log_dir).run())
    text = json.dumps(asdict(report) | {"ok": report.ok}, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
