"""Admission logic, without a bus: reasons name the field; any bytes give a Job or a Reject."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.arrival.admission import Admission, normalise
from shared.messages import Job, JobSpec, NodeStatus
from shared.reject import Reject


def spec(**kw: object) -> bytes:
    base: dict[str, object] = {"job_id": "train-42", "num_gpus": 4}
    base.update(kw)
    return json.dumps(base).encode()


def test_accepts_the_design_example_and_sets_submit_time_from_the_message() -> None:
    raw = json.dumps(
        {
            "job_id": "train-42",
            "user": "alice",
            "vc": "nlp",
            "num_gpus": 4,
            "gpu_types": ["V100", "A100", "V100"],
            "gpu_milli": 1000,
            "model": "bert-large",
            "command": ["python", "train.py"],
            "duration_hint_s": 7200,
            "weight": 1.0,
            "offload": {"param_bytes": 26000000000},
            "some_future_field": {"x": 1},
        }
    ).encode()
    job = Admission().admit(raw, timestamp_s=1234.5)
    assert job.job_id == "train-42"
    assert job.submit_time == 1234.5
    assert job.gpu_types == ["V100", "A100"]  # repeats dropped, order kept
    assert job.offload is not None and job.offload.param_bytes == 26_000_000_000
    assert "duration" not in msgspec.json.encode(job).decode().replace("duration_hint_s", "")


def test_given_submit_time_is_kept() -> None:
    assert Admission().admit(spec(submit_time=10.0), 99.0).submit_time == 10.0


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (spec(num_gpus=0), "$.num_gpus"),
        (spec(num_gpus=1025), "$.num_gpus"),
        (spec(num_gpus="4"), "$.num_gpus"),
        (spec(num_gpus=10**30), "$.num_gpus"),
        (spec(job_id="has space"), "$.job_id"),
        (spec(job_id="x" * 129), "$.job_id"),
        (spec(job_id=""), "$.job_id"),
        (spec(gpu_milli=0), "$.gpu_milli"),
        (spec(gpu_milli=1001), "$.gpu_milli"),
        (spec(weight=-1), "$.weight"),
        (spec(gpu_types="V100"), "$.gpu_types"),
        (spec(duration_hint_s=0), "$.duration_hint_s"),
        (b'{"num_gpus": 2}', "job_id"),
        (b'{"job_id": "a"}', "num_gpus"),
    ],
)
def test_invalid_fields_are_named(raw: bytes, field: str) -> None:
    with pytest.raises(Reject) as err:
        Admission().admit(raw, 0.0)
    assert field in err.value.reason
    assert err.value.kind == "invalid"


def test_not_json_and_empty() -> None:
    for raw in (b"", b"{", b"\xff\xfe", b"[1,2]", b"null"):
        with pytest.raises(Reject) as err:
            Admission().admit(raw, 0.0)
        assert err.value.reason


def test_share_needs_one_gpu() -> None:
    with pytest.raises(Reject, match="num_gpus=1"):
        Admission().admit(spec(num_gpus=2, gpu_milli=500), 0.0)


def test_duplicate_of_live_job_rejected_until_it_ends() -> None:
    a = Admission()
    a.admit(spec(), 0.0)
    with pytest.raises(Reject) as err:
        a.admit(spec(), 1.0)
    assert err.value.kind == "duplicate" and err.value.key == "train-42"
    a.ended("train-42", "events:0:7")
    a.ended("train-42", "events:0:7")  # the same event seen twice counts once
    a.admit(spec(), 2.0)
    with pytest.raises(Reject):
        a.admit(spec(), 3.0)


def test_unfit_jobs_rejected_once_inventory_known() -> None:
    a = Admission()
    a.admit(spec(job_id="early", num_gpus=64), 0.0)  # inventory unknown: accepted, waits
    for i in range(2):
        a.inventory.update(NodeStatus(node_id=f"n{i}", gpu_type="V100", gpus=8, free_gpus=[]))
    a.inventory.update(NodeStatus(node_id="p0", gpu_type="P100", gpus=4, free_gpus=[]))
    a.admit(spec(job_id="fits", num_gpus=20), 0.0)
    with pytest.raises(Reject, match="num_gpus=21") as err:
        a.admit(spec(job_id="big", num_gpus=21), 0.0)
    assert err.value.kind == "unfit"
    with pytest.raises(Reject, match="gpu_types"):
        a.admit(spec(job_id="a100", gpu_types=["A100"]), 0.0)
    with pytest.raises(Reject, match="exceeds the 4 GPUs"):
        a.admit(spec(job_id="p", num_gpus=5, gpu_types=["P100"]), 0.0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=12,
)
spec_like = st.fixed_dictionaries(
    {},
    optional={
        "job_id": st.text(max_size=140) | st.integers(),
        "num_gpus": st.integers() | st.floats() | st.text(max_size=3),
        "gpu_milli": st.integers(),
        "gpu_types": st.lists(st.text(max_size=8), max_size=3) | json_values,
        "weight": st.floats() | st.integers(),
        "submit_time": st.floats() | st.integers(),
        "offload": json_values,
    },
)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300) | spec_like.map(lambda d: json.dumps(d).encode()))
def test_any_bytes_give_a_job_or_a_reject(raw: bytes) -> None:
    try:
        job = Admission().admit(raw, 5.0)
    except Reject as rej:
        assert rej.reason
        return
    # Accepted: it round-trips, and a second computation of validity agrees.
    assert isinstance(job, Job)
    again = msgspec.json.decode(raw, type=JobSpec)
    assert normalise(again, 5.0) == job
    assert 0 < job.num_gpus <= 1024 and 1 <= job.gpu_milli <= 1000
