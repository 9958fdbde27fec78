"""Telemetry's figures for jobs that never ran: a job killed while it waited counts as
failed and done, and no JCT, queueing delay or reward part is computed from it."""

from __future__ import annotations

import pytest

from services.telemetry.windows import Telemetry, preemption_reason
from shared.messages import Job, JobEvent, NodeStatus


def test_a_job_killed_while_queued_is_failed_with_no_jct() -> None:
    t = Telemetry(window_s=100.0)
    t.node(NodeStatus("h", "V100", 2, [0, 1], time=0.0))
    t.accepted(Job("ran", 1, 0.0))
    t.accepted(Job("killed", 2, 0.0))
    t.event(JobEvent("ran", "started", 10.0, ["h"]))
    c = t.counters()
    assert (c["waiting"], c["running"], c["done"], c["failed"]) == (1, 1, 0, 0)
    t.event(JobEvent("killed", "cancelled", 20.0, [], "killed while queued"))
    t.event(JobEvent("ran", "finished", 40.0, ["h"]))
    t.event(JobEvent("killed", "failed", 41.0, ["h"], "killed before it started"))  # again
    c = t.counters()
    assert (c["waiting"], c["running"], c["done"], c["failed"], c["cancelled"]) == (0, 0, 2, 1, 1)
    for window in ("all", "window"):  # only the job that ran has a JCT (40 s, 10 s queued)
        snap = t.snapshot(50.0, window)
        assert (snap.jobs, snap.avg_jct_s, snap.avg_queue_s) == (1, 40.0, 10.0)
    assert t.reward().parts["jobs"] == 1.0


def test_a_job_submitted_after_the_clusters_clock_is_ahead_not_waiting() -> None:
    """A replay that publishes faster than the simulated cluster runs: jobs whose submit
    time the cluster's clock has not reached are not in its queue, so not `waiting`."""
    t = Telemetry(window_s=100.0)
    t.node(NodeStatus("h", "V100", 2, [0, 1], time=50.0))  # the cluster's clock: 50 s
    t.accepted(Job("due", 1, 50.0))  # submitted at the clock: waiting
    t.accepted(Job("early", 1, 10.0))  # waiting
    t.accepted(Job("future", 1, 51.0))  # one second ahead of the clock
    c = t.counters()
    assert (c["waiting"], c["ahead"], c["running"]) == (2, 1, 0)
    t.event(JobEvent("early", "started", 60.0, ["h"]))  # the clock passes 51 s
    c = t.counters()
    assert (c["waiting"], c["ahead"], c["running"]) == (2, 0, 1)


def test_a_move_is_a_new_segment_with_its_restore_a_redelivered_start_is_not() -> None:
    """A MoveOrder's `started` event of a running job ends its segment and begins one on
    the new GPUs, whose first `restart_s` are the move's restore, whichever of the
    batch and the event is read first; the same start read twice is one start; the
    job's JCT spans both segments."""
    from shared.messages import Assignment, MoveOrder, PlacementBatch

    for batch_first in (True, False):
        t = Telemetry(window_s=100.0)
        t.node(NodeStatus("a", "V100", 2, [0, 1]))
        t.node(NodeStatus("b", "P100", 2, [0, 1]))
        t.accepted(Job("x", 1, 0.0))
        t.event(JobEvent("x", "started", 10.0, ["a"], "a:0"))
        t.event(JobEvent("x", "started", 10.0, ["a"], "a:0"))  # redelivered: no move
        move = MoveOrder("x", [Assignment("x", "b", [1])], 30.0)
        batch = PlacementBatch(7, 50.0, [], solver_status="REPLACE", moves=[move])
        if batch_first:
            t.placement(batch)
        t.event(JobEvent("x", "started", 50.0, ["b"], "b:1"))
        if not batch_first:
            t.placement(batch)
        t.event(JobEvent("x", "finished", 90.0, ["b"]))
        (rec,) = t.records()
        got = [(s.start_s, s.finish_s, s.gpu_type, s.nodes, s.restart_s) for s in rec.segments]
        assert got == [(10.0, 50.0, "V100", "a:0", 0.0), (50.0, 90.0, "P100", "b:1", 30.0)]
        assert t.counters()["moves"] == 1 and 7 not in t.solves  # a replace round: no solve
        assert t.snapshot(95.0, "all").avg_jct_s == 90.0


def test_prometheus_jobs_gauge_carries_every_state_of_the_counters() -> None:
    """`rltune_jobs{state=...}` is what Grafana plots: each state, `ahead` included, reads
    the counters' value (a scrape of the process registry, not the gauge objects)."""
    from prometheus_client import REGISTRY

    from services.telemetry.service import export

    t = Telemetry(window_s=100.0)
    t.node(NodeStatus("h", "V100", 2, [0, 1], time=50.0))
    t.accepted(Job("a", 1, 10.0))
    t.accepted(Job("b", 1, 20.0))
    t.accepted(Job("c", 1, 70.0))  # ahead of the clock
    t.accepted(Job("d", 1, 90.0))  # ahead
    t.event(JobEvent("a", "started", 50.0, ["h"]))
    export(t)
    got = {
        s: REGISTRY.get_sample_value("rltune_jobs", {"state": s})
        for s in ("ahead", "waiting", "running", "done", "failed")
    }
    assert got == {"ahead": 2.0, "waiting": 1.0, "running": 1.0, "done": 0.0, "failed": 0.0}


def test_a_job_started_by_two_host_agents_is_one_run_not_a_move() -> None:
    """Each host agent reports its own node's start of a job given two nodes (details
    "pid P gpus ..."): one segment, no move, one JCT of 30 s."""
    t = Telemetry()
    t.node(NodeStatus("a", "GPU", 4, [], time=0.0))
    t.node(NodeStatus("b", "GPU", 4, [], time=0.0))
    t.accepted(Job("gang", 8, 0.0))
    t.event(JobEvent("gang", "started", 10.0, ["a"], "pid 11 gpus 0,1,2,3"))
    t.event(JobEvent("gang", "started", 10.5, ["b"], "pid 12 gpus 0,1,2,3"))
    t.event(JobEvent("gang", "finished", 30.0, ["a"], "exit code 0"))
    t.event(JobEvent("gang", "finished", 30.2, ["b"], "exit code 0"))  # (the second end)
    c = t.counters()
    assert (c["done"], c["failed"], c["moves"], c["cancelled"]) == (1, 0, 0, 0)
    (rec,) = t.records()
    assert [(g.start_s, g.finish_s) for g in rec.segments] == [(10.0, 30.0)]


@pytest.mark.parametrize(
    ("detail", "label"),
    [
        ("priority", "priority"),  # the simulator's and lockstep's details
        ("reclaim", "reclaim"),
        ("las", "las"),
        ("", "unspecified"),
        ("preempted (priority: class high of hi); exit code 143", "priority"),  # a host's
        ("preempted (reclaim: queue nlp); exit code -9", "reclaim"),
        ("preempted (because I said so); exit code 0", "other"),
        ("free text from a forged event", "other"),
    ],
)
def test_preemption_reason_label(detail: str, label: str) -> None:
    assert preemption_reason(detail) == label
