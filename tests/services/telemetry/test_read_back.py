"""Telemetry's start-up: a record read back and then consumed again (from the committed
offset) is applied once. Hand-made: one job started at 0, preempted at 100, started
again at 200, finished at 500, all read back, then the last three consumed again: its
run is 100 + 300 = 400 s in two segments, and one preemption."""

from __future__ import annotations

import re

import pytest

from services.telemetry.service import TelemetryHandler, TelemetrySettings
from shared.bus import ServiceStats
from shared.config import BusSettings
from shared.messages import Job, JobEvent, encode
from shared.reject import Reject
from shared.wire import Record

BUS = BusSettings(bootstrap="127.0.0.1:1", topic_prefix="p.")
T = BUS.topics


def _records() -> list[Record]:
    evs = [
        JobEvent("j", "started", 0.0, ["n"]),
        JobEvent("j", "preempted", 100.0, ["n"], "reclaim"),
        JobEvent("j", "started", 200.0, ["n"]),
        JobEvent("j", "finished", 500.0, ["n"]),
    ]
    out = [Record(T.jobs_accepted, 0, 0, b"j", encode(Job("j", 2, 0.0)))]
    out += [Record(T.jobs_events, 0, i, b"j", encode(e)) for i, e in enumerate(evs)]
    return out


def test_records_read_back_then_consumed_again_count_once() -> None:
    h = TelemetryHandler(BUS, ServiceStats(), TelemetrySettings())
    recs = _records()
    for r in recs[:4]:  # read back: the job, its start, its preemption, its second start
        h.replay(r)
    for r in recs[2:]:  # consumed from the committed offset: the preemption, both starts
        h(r)
    js = h.state.jobs["j"]
    assert [(s.start_s, s.finish_s) for s in js.segments] == [(0.0, 100.0), (200.0, 500.0)]
    assert js.done and sum(h.state.preemptions.values()) == 1
    assert h.stats.extra["skipped_read_back"] == 2  # offsets 1 and 2 of jobs.events


def test_a_malformed_record_read_back_is_still_dead_lettered_when_consumed() -> None:
    h = TelemetryHandler(BUS, ServiceStats(), TelemetrySettings())
    bad = Record(T.jobs_events, 0, 0, b"j", b'{"job_id": 7}')
    h.replay(bad)  # read back: passed over
    with pytest.raises(Reject, match=re.escape("invalid message on p.jobs.events")):
        h(bad)


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_events_read_before_their_job_count_in_prometheus_once_it_is_accepted() -> None:
    """Read back, a job's events may come before its accepted record (another topic):
    the state holds them, and the Prometheus counter and histograms must see them when
    the job is accepted, once, as they would live."""
    h = TelemetryHandler(BUS, ServiceStats(), TelemetrySettings())
    job = Job("late-j", 2, 0.0, vc="qv-late")
    evs = [
        JobEvent("late-j", "started", 10.0, ["n"]),
        JobEvent("late-j", "preempted", 100.0, ["n"], "reclaim: for qv-other"),
        JobEvent("late-j", "started", 200.0, ["n"]),
        JobEvent("late-j", "finished", 500.0, ["n"]),
    ]
    pre = _sample("rltune_preemptions_total", queue="qv-late", reason="reclaim")
    waits = _sample("rltune_queue_wait_seconds_count", queue="qv-late")
    jcts = _sample("rltune_job_completion_seconds_count", queue="qv-late")
    for i, e in enumerate(evs):
        h.replay(Record(T.jobs_events, 0, i, b"late-j", encode(e)))
    assert _sample("rltune_preemptions_total", queue="qv-late", reason="reclaim") == pre
    h.replay(Record(T.jobs_accepted, 0, 0, b"late-j", encode(job)))
    assert _sample("rltune_preemptions_total", queue="qv-late", reason="reclaim") == pre + 1
    assert _sample("rltune_queue_wait_seconds_count", queue="qv-late") == waits + 1
    assert _sample("rltune_job_completion_seconds_count", queue="qv-late") == jcts + 1
    js = h.state.jobs["late-j"]
    assert [(s.start_s, s.finish_s) for s in js.segments] == [(10.0, 100.0), (200.0, 500.0)]
