"""The arrival handler on every topic it reads: any bytes are answered or counted, never raised."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.arrival.service import ArrivalHandler
from shared.bus import Record, ServiceStats
from shared.config import BusSettings
from shared.messages import Job, JobEvent, NodeStatus, encode
from shared.reject import Reject

S = BusSettings()
T = S.topics


def rec(topic: str, value: bytes | None, offset: int = 0, key: bytes | None = None) -> Record:
    return Record(topic, 0, offset, key, value, timestamp_ms=7_000)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([T.cluster_nodes, T.jobs_events]), st.binary(max_size=200) | st.none())
def test_garbage_on_side_topics_is_counted_not_raised(topic: str, value: bytes | None) -> None:
    stats = ServiceStats()
    h = ArrivalHandler(S, stats)
    assert list(h(rec(topic, value))) == []
    kind, counter = {
        T.cluster_nodes: (NodeStatus, "ignored_bad_node_status"),
        T.jobs_events: (JobEvent, "ignored_bad_event"),
    }[topic]
    try:  # the rare byte string that is a valid message counts as nothing
        msgspec.json.decode(value or b"", type=kind)
        want = {}
    except msgspec.MsgspecError:
        want = {counter: 1}
    assert {k: v for k, v in stats.extra.items() if v} == want


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.none())
def test_garbage_on_submit_is_a_reject_with_a_reason(value: bytes | None) -> None:
    h = ArrivalHandler(S, ServiceStats())
    try:
        out = h(rec(T.jobs_submit, value))
    except Reject as rej:
        assert rej.reason
    else:  # random bytes that happen to be a valid JobSpec are accepted
        assert len(out) == 1 and out[0].topic == T.jobs_accepted


def test_accepted_job_is_stamped_with_the_message_time_and_keyed_by_id() -> None:
    h = ArrivalHandler(S, ServiceStats())
    (out,) = h(rec(T.jobs_submit, b'{"job_id": "a", "num_gpus": 2, "gpu_types": ["T4", "T4"]}'))
    job = msgspec.json.decode(out.value, type=Job)
    assert (out.key, job.submit_time, job.gpu_types) == ("a", 7.0, ["T4"])


def test_inventory_and_end_events_change_admission() -> None:
    h = ArrivalHandler(S, ServiceStats())
    node = NodeStatus(node_id="n0", gpu_type="V100", gpus=8, free_gpus=list(range(8)))
    h(rec(T.cluster_nodes, encode(node)))
    with pytest.raises(Reject) as err:  # 9 GPUs fit no set of nodes of an 8-GPU cluster
        h(rec(T.jobs_submit, b'{"job_id": "big", "num_gpus": 9}'))
    assert err.value.kind == "unfit"
    h(rec(T.jobs_submit, b'{"job_id": "j", "num_gpus": 8}'))
    end = JobEvent(job_id="j", kind="finished", time=1.0)
    h(rec(T.jobs_events, encode(end), offset=3))
    h(rec(T.jobs_submit, b'{"job_id": "j", "num_gpus": 8}'))  # its id is free again


def test_replay_rebuilds_the_live_set() -> None:
    h = ArrivalHandler(S, ServiceStats())
    h.replay(rec(T.jobs_accepted, b"{}", key=b"old"))
    with pytest.raises(Reject) as err:  # accepted before a restart: still live
        h(rec(T.jobs_submit, b'{"job_id": "old", "num_gpus": 1}'))
    assert err.value.kind == "duplicate"


def _submit(h: ArrivalHandler, spec: bytes, replay: bool, offset: int = 0) -> str:
    """'accepted', or the reason of the rejection."""
    headers = (("rltune-origin", b"replay"),) if replay else ()
    r = Record(T.jobs_submit, 0, offset, None, spec, timestamp_ms=7_000, headers=headers)
    try:
        (out,) = h(r)
    except Reject as rej:
        return rej.reason
    assert out.topic == T.jobs_accepted
    return "accepted"


def test_users_jobs_beside_a_replay_are_refused_at_once_with_the_reason() -> None:
    from services.arrival.service import ArrivalSettings

    mine, trace = b'{"job_id": "mine", "num_gpus": 1}', b'{"job_id": "t1", "num_gpus": 1}'
    bad = b'{"job_id": "oops", "num_gpus": 0}'
    # reject (rltune up --trace): users' jobs never, the replay's always
    h = ArrivalHandler(S, ServiceStats(), ArrivalSettings("reject"))
    why = _submit(h, mine, replay=False)
    assert why.startswith("job mine is not run: this deployment replays a trace")
    assert "`rltune up` without --trace" in why
    assert _submit(h, trace, replay=True) == "accepted"
    assert "num_gpus" in _submit(h, bad, replay=False)  # a malformed one: its own reason
    assert h.stats.extra["user_jobs_refused_in_replay"] == 1
    # run: every valid job, marked or not
    h = ArrivalHandler(S, ServiceStats(), ArrivalSettings("run"))
    assert _submit(h, trace, replay=True) == "accepted"
    assert _submit(h, mine, replay=False) == "accepted"
    # auto (the default): users' jobs until a replayed one is seen, then refused
    h = ArrivalHandler(S, ServiceStats())
    assert _submit(h, mine, replay=False) == "accepted"
    assert _submit(h, trace, replay=True) == "accepted"
    assert _submit(h, b'{"job_id": "mine2", "num_gpus": 1}', replay=False).startswith(
        "job mine2 is not run"
    )
