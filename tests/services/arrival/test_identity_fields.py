"""JobSpec's identity fields (`user`, `project`, `app`, `time_limit_s`): accepted and
carried onto `jobs.accepted`, refused with the field named when out of range, and an
older message without them still decodes as before."""

from __future__ import annotations

import json

import msgspec
import pytest

from services.arrival.admission import Admission
from shared.messages import Job
from shared.reject import Reject
from shared.replay import job_spec_of
from shared.traces import TraceJob


def spec(**kw: object) -> bytes:
    return json.dumps({"job_id": "j1", "num_gpus": 2, **kw}).encode()


def test_identity_travels_to_the_accepted_job() -> None:
    raw = spec(user="alice", project="llm", app="train.py", time_limit_s=14400)
    job = Admission().admit(raw, 5.0)
    assert (job.user, job.project, job.app, job.time_limit_s) == (
        "alice", "llm", "train.py", 14400.0
    )  # fmt: skip
    wire = json.loads(msgspec.json.encode(job))
    assert wire["project"] == "llm" and wire["app"] == "train.py"
    assert wire["time_limit_s"] == 14400.0


def test_a_message_without_them_is_as_before() -> None:
    job = Admission().admit(spec(), 5.0)
    assert (job.project, job.app, job.time_limit_s) == ("", "", None)
    # a Job encoded by an older producer (no identity keys) decodes with the defaults
    old = b'{"job_id":"j1","num_gpus":2,"submit_time":5.0,"user":"u"}'
    assert msgspec.json.decode(old, type=Job).time_limit_s is None


@pytest.mark.parametrize(
    "bad",
    [{"time_limit_s": 0}, {"time_limit_s": -60}, {"time_limit_s": 1e12},
     {"time_limit_s": "1h"}, {"project": "p" * 300}, {"app": 7}],
)  # fmt: skip
def test_out_of_range_is_refused_naming_the_field(bad: dict[str, object]) -> None:
    with pytest.raises(Reject) as err:
        Admission().admit(spec(**bad), 5.0)
    assert f"$.{next(iter(bad))}" in str(err.value)


def test_non_finite_time_limit_is_refused() -> None:
    # JSON has no Infinity / NaN; a producer that writes them anyway is refused
    for text in (b"Infinity", b"NaN", b"1e999"):
        raw = b'{"job_id": "j1", "num_gpus": 2, "time_limit_s": ' + text + b"}"
        with pytest.raises(Reject):
            Admission().admit(raw, 5.0)


def test_replay_publishes_the_traces_identity() -> None:
    tj = TraceJob("7", 0.0, 99.0, 8, user="3", project="7", app="12", time_limit_s=600.0)
    s = job_spec_of(tj)
    assert (s.user, s.project, s.app, s.time_limit_s) == ("3", "7", "12", 600.0)
    assert "99" not in msgspec.json.encode(s).decode()  # never the run time
