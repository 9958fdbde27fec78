"""The mixed load of the arrival integration tests: valid JobSpecs and hypothesis-made garbage,
and a reader that collects what the arrival service answered."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from services.arrival.admission import Admission
from shared.bus import SRC_HEADER, partitions_of, raw_text, read_to_end
from shared.config import BusSettings
from shared.messages import Job, MetricsSnapshot, Rejection
from shared.reject import Reject

_VALID_KEYS = ("job_id", "num_gpus", "gpu_milli", "weight", "gpu_types", "user", "submit_time")


def _bad_messages() -> st.SearchStrategy[bytes]:
    """Garbage of every kind a user or a broken client could send."""
    ident = st.from_regex(r"[a-z]{1,8}-[0-9]{1,6}", fullmatch=True)
    wrong_type = st.fixed_dictionaries(
        {"job_id": ident},
        optional={
            "num_gpus": st.text(max_size=5) | st.lists(st.integers(), max_size=2) | st.none(),
            "gpu_milli": st.text(max_size=3) | st.booleans(),
            "weight": st.text(max_size=3) | st.lists(st.floats(), max_size=2),
        },
    ).filter(lambda d: len(d) > 1)
    out_of_range = st.fixed_dictionaries(
        {
            "job_id": ident,
            "num_gpus": st.integers(max_value=0) | st.integers(min_value=1025),
        },
        optional={"gpu_milli": st.integers(min_value=1001) | st.integers(max_value=0)},
    )
    huge = st.fixed_dictionaries(
        {"job_id": ident, "num_gpus": st.integers(min_value=2**63, max_value=2**200)}
    )
    bad_id = st.fixed_dictionaries(
        {
            "job_id": st.text(min_size=129, max_size=200) | st.just("") | st.just("a b/c"),
            "num_gpus": st.integers(1, 8),
        }
    )
    as_json = (wrong_type | out_of_range | huge | bad_id).map(lambda d: json.dumps(d).encode())
    truncated = st.tuples(
        st.fixed_dictionaries({"job_id": ident, "num_gpus": st.integers(1, 8)}),
        st.integers(1, 20),
    ).map(lambda t: json.dumps(t[0]).encode()[: -t[1]])
    return st.binary(max_size=200) | as_json | truncated


@functools.lru_cache(maxsize=4)
def hypothesis_garbage(n: int, seed: int = 0) -> tuple[bytes, ...]:
    """`n` bad messages drawn by hypothesis (deterministic; cached: drawing is slow)."""
    out: list[bytes] = []
    per_example = 16  # drawn as small lists: hypothesis' cost is mostly per example

    @settings(
        max_examples=3 * n // per_example + 10,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(st.lists(_bad_messages(), min_size=1, max_size=per_example, unique=True))
    def collect(batch: list[bytes]) -> None:
        out.extend(b for b in batch if len(out) < n and _surely_invalid(b))

    collect()
    rng = random.Random(seed)
    while len(out) < n:  # hypothesis ran out of distinct examples: vary the ones it gave
        out.append(rng.choice(out) + bytes([rng.randrange(256)]) if out else b"\x00")
    return tuple(out)


def _surely_invalid(b: bytes) -> bool:
    try:
        Admission().admit(b, 0.0)
    except Reject:
        return True
    return False


def valid_specs(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        spec: dict[str, object] = {"job_id": f"job-{i}", "num_gpus": rng.choice([1, 2, 4, 8, 16])}
        if rng.random() < 0.3:
            spec["gpu_types"] = rng.sample(["V100", "P100", "A100", "T4"], rng.randint(1, 2))
        if rng.random() < 0.2:
            spec.update(num_gpus=1, gpu_milli=rng.randint(1, 1000))
        if rng.random() < 0.5:
            spec["user"] = f"u{rng.randrange(50)}"
        out.append(json.dumps(spec).encode())
    return out


def mixed_load(n_valid: int, n_bad: int, seed: int = 0) -> list[bytes]:
    """Valid specs, garbage, and duplicates of valid ids (sent after their original),
    shuffled together. Duplicates count among the bad ones."""
    valid = valid_specs(n_valid, seed)
    n_dup = n_bad // 10
    garbage = hypothesis_garbage(n_bad - n_dup, seed)
    msgs = valid + list(garbage)
    rng = random.Random(seed)
    rng.shuffle(msgs)
    for i in rng.sample(range(n_valid), n_dup):  # a duplicate lands after its original
        original = valid[i]
        pos = msgs.index(original)
        msgs.insert(rng.randint(pos + 1, len(msgs)), original)
    return msgs


def expected_outcome(msgs: list[bytes]) -> tuple[Counter[str], Counter[str]]:
    """A second computation: accepted job ids and rejected raw texts, by the pure logic."""
    a = Admission()
    accepted: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    for m in msgs:
        try:
            accepted[a.admit(m, 0.0).job_id] += 1
        except Reject:
            rejected[raw_text(m)] += 1
    return accepted, rejected


async def produce(settings: BusSettings, msgs: list[bytes], topic: str | None = None) -> None:
    """Publish `msgs` to jobs.submit (or `topic`) keyed by their job_id when they have one,
    as any client may: up to 8 MiB a message (the embedded broker takes it)."""
    p = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, max_request_size=8 << 20)
    await p.start()
    try:
        futs = []
        for m in msgs:
            try:
                key = msgspec.json.decode(m).get("job_id")
            except Exception:
                key = None
            k = key.encode() if isinstance(key, str) else None
            futs.append(await p.send(topic or settings.topics.jobs_submit, m, key=k))
        await asyncio.gather(*futs)
    finally:
        await p.stop()


@dataclass
class Answers:
    accepted: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)
    inputs: Counter[int] = field(default_factory=Counter)  # jobs.submit offsets answered

    @property
    def total(self) -> int:
        return sum(self.accepted.values()) + sum(self.rejected.values())


async def collect_answers(settings: BusSettings, expect: int, timeout_s: float) -> Answers:
    """Read jobs.accepted and jobs.rejected from the beginning until `expect` answers have
    come and nothing more arrives for a second (so extras would be seen), or timeout."""
    ans, _ = await _read_answers(settings, lambda ans, _at_end: ans.total >= expect, timeout_s)
    return ans


async def settled_answers(settings: BusSettings, timeout_s: float = 60) -> Answers:
    """Every answer on jobs.accepted and jobs.rejected, for when no service is running:
    read past the end offsets the broker reports and until nothing more arrives for a
    second (Tansu reports the start of the last batch as the end)."""
    ans, settled = await _read_answers(settings, lambda _ans, at_end: at_end, timeout_s)
    if not settled:
        raise AssertionError(f"answers still coming or unread after {timeout_s} s")
    return ans


async def _read_answers(
    settings: BusSettings, done: Callable[[Answers, bool], bool], timeout_s: float
) -> tuple[Answers, bool]:
    """Read the answers until `done(answers, at the end offsets read first)` holds and
    nothing more arrives for a second (then True), or timeout (then False)."""
    t = settings.topics
    c = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, enable_auto_commit=False)
    await c.start()
    ans = Answers()
    job_dec = msgspec.json.Decoder(Job)
    rej_dec = msgspec.json.Decoder(Rejection)
    submit = f"|{t.jobs_submit}:".encode()
    try:
        parts = await partitions_of(c, [t.jobs_accepted, t.jobs_rejected])
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        end = await c.end_offsets(parts)
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=200)
            if batch:
                quiet_since = time.monotonic()
            for tp, msgs in batch.items():
                for m in msgs:
                    if tp.topic == t.jobs_accepted:
                        ans.accepted[job_dec.decode(m.value).job_id] += 1
                    else:
                        r = rej_dec.decode(m.value)
                        ans.rejected[r.raw] += 1
                        ans.reasons.append(r.reason)
                    src = dict(m.headers or ()).get(SRC_HEADER, b"")
                    if submit in src:
                        ans.inputs[int(src.split(b"@")[0].rsplit(b":", 1)[1])] += 1
            at_end = all([await c.position(tp) >= end[tp] for tp in parts])
            if done(ans, at_end) and time.monotonic() - quiet_since > 1.0:
                return ans, True
    finally:
        await c.stop()
    return ans, False


async def committed_offset(settings: BusSettings, group_id: str, topic: str) -> int:
    """The offset `group_id` has committed on `topic` (one partition); 0 if none."""
    c = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap, group_id=group_id, enable_auto_commit=False
    )
    await c.start()
    try:
        (tp,) = await partitions_of(c, [topic])
        c.assign([tp])
        return max(await c.committed(tp) or 0, 0)
    finally:
        await c.stop()


async def service_counters(settings: BusSettings, source: str) -> list[dict[str, float]]:
    """Every counters snapshot `source` has published on the metrics topic so far."""
    c = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, enable_auto_commit=False)
    await c.start()
    dec = msgspec.json.Decoder(MetricsSnapshot)
    out: list[dict[str, float]] = []
    try:
        parts = await partitions_of(c, [settings.topics.metrics])
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        async for msgs in read_to_end(c, parts):
            for m in msgs:
                snap = dec.decode(m.value)
                if snap.source == source:
                    out.append(snap.counters)
    finally:
        await c.stop()
    return out
