"""`rltune jobs`: the table built from the topics' records, in any interleaving of
topics, against states and queue positions worked out by hand."""

from __future__ import annotations

import itertools
import random

from rltune.jobs import JobsTable, render
from shared.messages import Job, JobEvent, PriorityBatch, Rejection, encode
from shared.topics import Topics
from shared.wire import Record

T = Topics("rltune.")

# a: ran and finished on n1; b: runs on n1+n2 (one started event per node); c: was
# preempted and waits again; d: waits, ranked after c; e: cancelled while queued;
# f: failed with exit code 3; bad: rejected; g: accepted after the latest round
JOBS = [Job(j, 2, 100.0 + i, user="u") for i, j in enumerate("abcdefg")]
EVENTS = [
    JobEvent("a", "started", 110.0, ["n1"], "pid 1 gpus 0,1"),
    JobEvent("b", "started", 111.0, ["n1"]),
    JobEvent("b", "started", 111.0, ["n2"]),
    JobEvent("c", "started", 112.0, ["n2"]),
    JobEvent("a", "finished", 120.0, ["n1"], "exit code 0", exit_code=0),
    JobEvent("c", "preempted", 121.0, ["n2"]),
    JobEvent("e", "cancelled", 122.0, [], "killed while queued"),
    JobEvent("f", "started", 123.0, ["n3"]),
    JobEvent("f", "failed", 124.0, ["n3"], "exit code 3; stderr:\nboom", exit_code=3),
    JobEvent("a", "finished", 125.0, ["n1"], "exit code 0", exit_code=0),  # redelivered
]
ROUNDS = [
    PriorityBatch(1, 105.0, [("a", 1.0), ("b", 0.9), ("c", 0.8), ("d", 0.7)]),
    PriorityBatch(2, 122.5, [("b", 1.0), ("e", 0.9), ("c", 0.8), ("d", 0.7)]),
]
REJECTED = [Rejection("bad", "num_gpus: expected >= 1", "{}")]


def _records() -> list[Record]:
    out = []
    for topic, msgs in (
        (T.jobs_accepted, JOBS),
        (T.jobs_events, EVENTS),
        (T.sched_priorities, ROUNDS),
        (T.jobs_rejected, REJECTED),
    ):
        out += [Record(topic, 0, i, None, encode(m)) for i, m in enumerate(msgs)]
    return out


def _interleavings(seed: int) -> list[Record]:
    """The records with each topic kept in its own order, topics shuffled together."""
    by_topic: dict[str, list[Record]] = {}
    for r in _records():
        by_topic.setdefault(r.topic, []).append(r)
    rng = random.Random(seed)
    out: list[Record] = []
    while any(by_topic.values()):
        topic = rng.choice([t for t, rs in by_topic.items() if rs])
        out.append(by_topic[topic].pop(0))
    return out


def test_states_positions_and_nodes_worked_out_by_hand() -> None:
    for seed in range(20):  # the same answer whichever topic is read first
        table = JobsTable(T)
        for r in _interleavings(seed):
            table.add(r)
        rows = {r.job_id: r for r in table.rows(everything=True)}
        got = {j: (r.state, r.position) for j, r in rows.items()}
        assert got == {
            "a": ("FINISHED", None),
            "b": ("RUNNING", None),
            "c": ("PENDING", 1),  # round 2: b runs, e was cancelled, so c is next
            "d": ("PENDING", 2),
            "e": ("CANCELLED", None),
            "f": ("FAILED", None),
            "g": ("PENDING", None),  # no round has ranked it yet
            "bad": ("REJECTED", None),
        }, seed
        assert rows["b"].nodes == ["n1", "n2"] and rows["b"].start == 111.0
        assert (rows["a"].end, rows["a"].exit_code) == (120.0, 0)  # the first end counts
        assert (rows["f"].exit_code, rows["f"].nodes) == (3, ["n3"])
        assert rows["c"].start == 112.0 and rows["c"].end is None
        assert rows["bad"].detail == "num_gpus: expected >= 1"
        # squeue's default: the pending and running jobs, and a count of the rest
        assert [r.job_id for r in table.rows()] == ["b", "c", "d", "g"]
        text = render(table.rows(), table.counts(), everything=False)
        assert text.splitlines()[0].split() == [
            "JOBID", "STATE", "POS", "GPUS", "USER", "SUBMIT", "START", "END", "NODES", "INFO"
        ]  # fmt: skip
        assert text.splitlines()[1].split()[:4] == ["b", "RUNNING", "-", "2"]
        assert text.splitlines()[2].split()[:3] == ["c", "PENDING", "1"]
        assert text.splitlines()[-1] == (
            "1 cancelled, 1 failed, 1 finished, 1 rejected not listed (--all lists them)"
        )
        failed = next(ln for ln in render(table.rows(True), {}, True).splitlines() if "f " in ln)
        assert failed.endswith("exit code 3; stderr: | boom")


def test_garbage_on_any_topic_is_skipped() -> None:
    table = JobsTable(T)
    for i, topic in zip(range(8), itertools.cycle(table.topics), strict=False):
        table.add(Record(topic, 0, i, None, b"{not json" if i % 2 else None))
    table.add(Record(T.jobs_accepted, 0, 9, None, encode(Job("ok", 1, 1.0))))
    assert [(r.job_id, r.state) for r in table.rows()] == [("ok", "PENDING")]
