"""Admission logic, without a bus: reasons name the field; any bytes give a Job or a Reject."""

from __future__ import annotations

import json
import re
import string

import msgspec
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from services.arrival.admission import Admission
from shared.messages import Job, NodeStatus, OffloadSpec
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

# The JobSpec rules of DESIGN.md, written out here rather than taken from the code:
# job_id 1-128 of A-Za-z0-9._:-, 0 < num_gpus <= 1024, gpu_milli 1-1000 (a share
# below 1000 is of one GPU), everything else optional, unknown fields ignored.
ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ID_CHARS = string.ascii_letters + string.digits + "._:-"
floats = st.floats(-1e300, 1e300)
short = st.text(max_size=12)
gpu_type_names = st.sampled_from(["V100", "A100", "P100", "T4"]) | st.text(min_size=1, max_size=8)
optional_fields = {
    "user": short,
    "vc": short,
    "model": short,
    "gpu_types": st.lists(gpu_type_names, max_size=6),
    "command": st.lists(short, max_size=4),
    "duration_hint_s": st.floats(1e-3, 1e9),
    "weight": st.floats(1e-6, 1e6),
    "submit_time": st.floats(0.0, 1e11),
    "offload": st.fixed_dictionaries(
        {},
        optional={
            "param_bytes": st.integers(0, 2**62),
            "optimizer_bytes": st.integers(0, 2**62),
            "activation_bytes": st.integers(0, 2**62),
        },
    ),
    "some_future_field": st.recursive(  # unknown: ignored
        st.none() | st.booleans() | st.integers() | floats | short,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(short, c, max_size=3),
        max_leaves=6,
    ),
}


def _bad_id() -> st.SearchStrategy[object]:
    ok = st.text(ID_CHARS, max_size=20)
    odd = st.characters().filter(lambda ch: ch not in ID_CHARS)
    return (
        st.just("")
        | st.text(ID_CHARS, min_size=129, max_size=140)
        | st.tuples(ok, odd, ok).map("".join)
        | st.integers()
        | st.none()
    )


# One bad field at a time: (field, strategy for its value, what the reason must name).
bad_fields: list[tuple[str, st.SearchStrategy[object], str]] = [
    ("job_id", _bad_id(), "$.job_id"),
    ("num_gpus", st.integers(max_value=0) | st.integers(min_value=1025), "$.num_gpus"),
    ("num_gpus", st.text(max_size=4) | st.floats(0.1, 9.9) | st.booleans(), "$.num_gpus"),
    ("gpu_milli", st.integers(max_value=0) | st.integers(min_value=1001), "$.gpu_milli"),
    ("gpu_types", short | st.lists(st.just(""), min_size=1, max_size=2), "$.gpu_types"),
    ("weight", st.floats(-1e300, 0.0) | st.floats(1e6, 1e300, exclude_min=True), "$.weight"),
    ("duration_hint_s", st.floats(-1e300, 0.0) | st.just("2h"), "$.duration_hint_s"),
    ("submit_time", st.floats(-1e300, -1e-9) | st.floats(1e11 + 1, 1e300), "$.submit_time"),
    ("user", st.text(min_size=257, max_size=270) | st.integers(), "$.user"),
    ("command", short | st.lists(st.integers(), min_size=1, max_size=2), "$.command"),
    ("offload", st.just({"param_bytes": -1}) | st.just("big"), "$.offload"),
]


@st.composite
def job_specs(draw: st.DrawFn) -> tuple[dict[str, object], tuple[str, str] | None]:
    """A JobSpec as a JSON object, and (field, what the reason names) if it must be
    refused: about two in three are valid, the others have exactly one bad field."""
    d: dict[str, object] = {"job_id": draw(st.text(ID_CHARS, min_size=1, max_size=128))}
    shared = draw(st.booleans())
    if shared:  # a share of one GPU
        d["num_gpus"], d["gpu_milli"] = 1, draw(st.integers(1, 999))
    else:
        d["num_gpus"] = draw(st.integers(1, 1024))
        if draw(st.booleans()):
            d["gpu_milli"] = 1000
    for name, values in optional_fields.items():
        if draw(st.booleans()):
            d[name] = draw(values)
    bad: tuple[str, str] | None = None
    outcome = draw(st.sampled_from(["valid"] * 13 + ["bad field"] * 5 + ["share", "missing"]))
    if outcome == "bad field":
        field, values, named = draw(st.sampled_from(bad_fields))
        d[field] = draw(values)
        bad = (field, named)
    elif outcome == "share":  # a share of one GPU asked of several
        d["num_gpus"], d["gpu_milli"] = draw(st.integers(2, 1024)), draw(st.integers(1, 999))
        bad = ("gpu_milli", "num_gpus=1")
    elif outcome == "missing":
        field = draw(st.sampled_from(["job_id", "num_gpus"]))
        del d[field]
        bad = (field, f"`{field}`")
    return d, bad


def _expected_job(d: dict[str, object], now: float) -> Job:
    """The accepted form by DESIGN.md: defaults filled in, submit_time from the
    message when absent, repeated GPU types dropped (first kept), unknowns gone."""
    types: list[str] = []
    for t in d.get("gpu_types", []):  # type: ignore[attr-defined]
        if t not in types:
            types.append(t)
    offload = d.get("offload")
    return Job(
        job_id=d["job_id"],  # type: ignore[arg-type]
        num_gpus=d["num_gpus"],  # type: ignore[arg-type]
        submit_time=d.get("submit_time", now),  # type: ignore[arg-type]
        user=d.get("user", ""),  # type: ignore[arg-type]
        vc=d.get("vc", ""),  # type: ignore[arg-type]
        gpu_types=types,
        gpu_milli=d.get("gpu_milli", 1000),  # type: ignore[arg-type]
        model=d.get("model", ""),  # type: ignore[arg-type]
        command=d.get("command", []),  # type: ignore[arg-type]
        duration_hint_s=d.get("duration_hint_s"),  # type: ignore[arg-type]
        weight=d.get("weight", 1.0),  # type: ignore[arg-type]
        offload=None if offload is None else OffloadSpec(**offload),  # type: ignore[arg-type]
    )


@settings(max_examples=300, deadline=None)
@given(case=job_specs(), now=st.floats(0.0, 1e10))
def test_specs_are_accepted_as_designed_or_refused_naming_the_field(
    case: tuple[dict[str, object], tuple[str, str] | None], now: float
) -> None:
    d, bad = case
    raw = json.dumps(d, allow_nan=False).encode()
    adm = Admission()
    if bad is None:
        event("accepted")
        job = adm.admit(raw, now)
        assert job == _expected_job(d, now)
        assert ID_RE.fullmatch(job.job_id) and 0 < job.num_gpus <= 1024
        assert adm.is_live(job.job_id)
        with pytest.raises(Reject) as dup:  # the same id again, while live
            adm.admit(raw, now + 1)
        assert dup.value.kind == "duplicate" and dup.value.key == job.job_id
        return
    field, named = bad
    event(f"refused: {field}")
    with pytest.raises(Reject) as err:
        adm.admit(raw, now)
    assert named in err.value.reason, (field, err.value.reason)
    assert err.value.kind == "invalid"
    if field != "job_id":  # filed under the job's own id
        assert err.value.key == d["job_id"]
    assert adm.live_count == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | spec_like.map(lambda d: json.dumps(d).encode()))
def test_any_bytes_give_a_job_or_a_reject(raw: bytes) -> None:
    """Robustness only (the test above checks what is accepted): nothing but a Job
    or a Reject with a reason comes out, and a Job keeps the DESIGN.md ranges."""
    try:
        job = Admission().admit(raw, 5.0)
    except Reject as rej:
        assert rej.reason
        return
    assert isinstance(job, Job)
    assert ID_RE.fullmatch(job.job_id)
    assert 0 < job.num_gpus <= 1024 and 1 <= job.gpu_milli <= 1000
    assert len(set(job.gpu_types)) == len(job.gpu_types)
