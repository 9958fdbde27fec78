"""Reclaim on live hosts (services/scoring/reclaim.py) on hand-made scoring states: which
borrowers a waiting job of a guaranteed queue preempts, and when none."""

from __future__ import annotations

import msgspec

from services.scoring.policies import make_policy
from services.scoring.queue import ScoringState
from services.scoring.reclaim import STOPPING_S, LiveReclaim
from shared.cluster import ClusterSpec, NodeSpec, PriorityClass, QueueSpec
from shared.messages import Job, JobEvent, KillRequest, NodeStatus

NODES = (NodeSpec("h-0", "GPU", 4), NodeSpec("h-1", "GPU", 4))
QUEUES = {
    "prod": QueueSpec(guaranteed_gpus=4),
    "research": QueueSpec(guaranteed_gpus=2),
    "ads": QueueSpec(guaranteed_gpus=2),
}
CLASSES = {"serve": PriorityClass(100, False), "low": PriorityClass(1, True)}
CLUSTER = ClusterSpec("c", NODES, queues=QUEUES, priority_classes=CLASSES)


def _state() -> ScoringState:
    s = ScoringState(make_policy("fifo"), CLUSTER)
    for n in NODES:
        s.node(NodeStatus(n.node_id, "GPU", 4, list(range(4))))
    return s


def _run(
    s: ScoringState, jid: str, vc: str, gpus: int, node: str, at: float, cls: str = ""
) -> None:
    s.accepted(Job(jid, gpus, 0.0, vc=vc, priority_class=cls), free=True)
    s.placed([jid])
    s.event(JobEvent(jid, "started", at, [node]), free=True)
    busy = sum(q.num_gpus for j, q in s.running.items() if s.nodes_of.get(j) == [node])
    s.node(NodeStatus(node, "GPU", 4, list(range(busy, 4))))


def _borrowing() -> ScoringState:
    """Every GPU held, research 4 over its guarantee, prod's p1 (2 GPUs) waiting."""
    s = _state()
    _run(s, "r1", "research", 4, "h-0", 0.0)  # research borrows 2 beyond its 2
    _run(s, "a1", "ads", 2, "h-1", 0.0)  # ads inside its guarantee
    _run(s, "r2", "research", 2, "h-1", 100.0)  # research now 4 over
    s.accepted(Job("p1", 2, 200.0, vc="prod"), free=True)
    return s


def test_a_job_inside_its_guarantee_preempts_the_newest_borrower_past_its_minimum_run() -> None:
    s = _borrowing()
    r = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    assert r.check(s, 300.0) == []  # both borrowers inside their minimum run time
    assert s.first == []
    # r1 past it (r2 not): r1 alone frees what p1 needs
    early = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0).check(_borrowing(), 650.0)
    assert [k.job_id for k in early] == ["r1"]
    kills = r.check(s, 701.0)  # both past it: the newest (r2) frees enough alone
    assert [(k.job_id, k.requeue, k.grace_s) for k in kills] == [("r2", True, 30.0)]
    assert kills[0].reason == "reclaim: queue prod's guarantee, for p1"
    assert s.first == ["p1"]
    assert r.check(s, 702.0) == []  # r2 is stopping: not asked again, p1 still first
    assert s.first == ["p1"]
    # its stop comes back: r2 waits again, p1 leads the next round on the freed GPUs
    s.event(JobEvent("r2", "preempted", 703.0, ["h-1"]), free=True)
    s.node(NodeStatus("h-1", "GPU", 4, [2, 3]))
    batch = s.free_round(1, 704.0)
    assert batch is not None and [j for j, _ in batch.jobs][:1] == ["p1"]
    assert "r2" in s.queued


def test_no_preemption_of_a_queue_inside_its_guarantee_or_a_non_preemptible_job() -> None:
    s = _state()
    _run(s, "a1", "ads", 2, "h-0", 0.0)  # inside ads' guarantee
    _run(s, "s1", "research", 4, "h-1", 0.0, cls="serve")  # non-preemptible borrower
    _run(s, "a2", "ads", 2, "h-0", 0.0)  # ads over by 2, preemptible
    s.accepted(Job("p1", 4, 10.0, vc="prod"), free=True)
    r = LiveReclaim(CLUSTER, grace_s=0.0, min_run_s=0.0)
    # ads gives back only what it holds beyond its guarantee (2 of 4); research's job
    # may not be preempted: p1 (4 GPUs) cannot be made to fit
    assert r.check(s, 1000.0) == []
    # a job that 2 GPUs make fit takes them from ads' newest borrower
    s.accepted(Job("p2", 2, 11.0, vc="prod"), free=True)
    kills = r.check(s, 1000.0)
    assert [k.job_id for k in kills] == ["a2"]
    # a job of a queue with no unused guarantee reclaims nothing (it may only borrow)
    s2 = _state()
    _run(s2, "p9", "prod", 8, "h-0", 0.0)
    s2.accepted(Job("x", 1, 1.0, vc="nobody"), free=True)
    assert LiveReclaim(CLUSTER, 0.0, 0.0).check(s2, 1000.0) == [] and s2.first == []


def test_a_job_on_two_hosts_waits_again_once_both_processes_stopped() -> None:
    s = _state()
    s.accepted(Job("g", 8, 0.0, vc="research"), free=True)
    s.placed(["g"])
    for node in ("h-0", "h-1"):  # each host agent reports its own start and stop
        s.event(JobEvent("g", "started", 1.0, [node]), free=True)
    s.event(JobEvent("g", "preempted", 50.0, ["h-0"]), free=True)
    assert s.where("g") == "running"  # h-1's process still stops: not placed again yet
    s.event(JobEvent("g", "preempted", 52.0, ["h-1"]), free=True)
    assert s.where("g") == "queued" and not s.stopping
    assert s.preempts["g"] == 1


def _urgent(preempt_lower: bool = True) -> tuple[ClusterSpec, ScoringState]:
    """prod's l1 (4 GPUs, from 0) and l2 (2, from 100) of class low, other's x1 (2,
    from 200), every GPU held; prod's u1 (2 GPUs, class urgent) waiting."""
    classes = {**CLASSES, "urgent": PriorityClass(50, True, None, preempt_lower)}
    queues = {"prod": QueueSpec(limit_gpus=8), "other": QueueSpec()}
    cl = ClusterSpec("c", NODES, queues=queues, priority_classes=classes)
    s = ScoringState(make_policy("fifo"), cl)
    for n in NODES:
        s.node(NodeStatus(n.node_id, "GPU", 4, list(range(4))))
    _run(s, "l1", "prod", 4, "h-0", 0.0, cls="low")
    _run(s, "l2", "prod", 2, "h-1", 100.0, cls="low")
    _run(s, "x1", "other", 2, "h-1", 200.0, cls="low")  # another queue: never a victim
    s.accepted(Job("u1", 2, 300.0, vc="prod", priority_class="urgent"), free=True)
    return cl, s


def test_a_higher_class_preempts_its_own_queues_lower_jobs_with_the_reason() -> None:
    cl, s = _urgent()
    r = LiveReclaim(cl, grace_s=30.0, min_run_s=600.0)
    assert r.check(s, 500.0) == []  # every candidate inside its minimum run time
    assert [k.job_id for k in r.check(s, 650.0)] == ["l1"]  # only l1 is past it
    cl, s = _urgent()
    r = LiveReclaim(cl, grace_s=30.0, min_run_s=600.0)
    kills = r.check(s, 800.0)  # both past it: the newest of prod's (l2) frees enough
    assert [(k.job_id, k.requeue, k.grace_s) for k in kills] == [("l2", True, 30.0)]
    assert kills[0].reason == "priority: class urgent of u1"
    assert s.first == ["u1"]
    assert r.check(s, 801.0) == [] and s.first == ["u1"]  # l2 stopping: u1 stays first
    # a class without preempt_lower waits
    cl, s = _urgent(preempt_lower=False)
    assert LiveReclaim(cl, grace_s=30.0, min_run_s=600.0).check(s, 800.0) == []


def test_a_restarted_reclaim_takes_up_the_preemptions_asked_before() -> None:
    # the first scoring asked r2 to stop for p1 at t=701 (as above) and died; a second
    # one reads that request back from jobs.kill (timestamp 701)
    s = _borrowing()
    asked = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0).check(s, 701.0)
    assert [k.job_id for k in asked] == ["r2"]
    again = _borrowing()
    r = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    r.restore(asked[0], 701.0)
    # r2 still runs the segment it was asked to stop (started 100 <= 701): it is
    # stopping, not asked again, no other borrower taken in its place, p1 leads
    assert r.check(again, 705.0) == []
    assert again.first == ["p1"] and r.draining == {"r2": ("p1", 701.0)}
    # ... until its grace and STOPPING_S (30 + 30 s) are over: then it is asked again
    assert [k.job_id for k in r.check(again, 762.0)] == ["r2"]
    # a request older than the victim's current segment was answered by an earlier
    # `preempted`: r2 (started at 100) asked at 50 is not stopping
    stale = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    stale.restore(asked[0], 50.0)
    assert [k.job_id for k in stale.check(_borrowing(), 705.0)] == ["r2"]
    # the request names the job it makes room for; one read back without it (an older
    # request, or a user's requeue) still counts as stopping, for no job in particular
    assert asked[0].for_job == "p1"
    anon = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    anon.restore(msgspec.structs.replace(asked[0], for_job=None), 701.0)
    assert anon.check(_borrowing(), 705.0) == [] and anon.draining == {"r2": ("", 701.0)}


def test_a_later_request_naming_no_job_does_not_hide_the_job_an_earlier_one_was_for() -> None:
    """Read back after a restart: reclaim's request for r2 (for p1), then a second one
    naming no job (a user's, sent while r2 stops). r2 drains for p1 from the first
    request's time; p1 still leads and no other borrower is asked in r2's place (with
    the second request's empty owner, p1 would have looked unserved and r1 been asked)."""
    asked = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0).check(_borrowing(), 701.0)
    assert [(k.job_id, k.for_job) for k in asked] == [("r2", "p1")]
    r = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    r.restore(asked[0], 701.0)
    r.restore(KillRequest("r2", "a second request", requeue=True, grace_s=1.0), 703.0)
    s = _borrowing()
    assert r.check(s, 705.0) == []
    assert r.draining == {"r2": ("p1", 701.0)} and s.first == ["p1"]


def test_a_request_read_back_before_its_victims_start_waits_for_it() -> None:
    """The request comes back before r2's `started` (topics are read back in no fixed
    order): it is kept until r2's start is known, then taken up, not dropped (dropped,
    the next check would ask r2 again)."""
    asked = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0).check(_borrowing(), 701.0)
    r = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    r.restore(asked[0], 701.0)
    early = _state()  # nothing read back yet but the request
    assert r.check(early, 702.0) == [] and "r2" in r.restored
    assert r.check(_borrowing(), 705.0) == []
    assert r.draining == {"r2": ("p1", 701.0)}
    # a request whose victim never shows up is let go once a stop would be over
    gone = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    gone.restore(asked[0], 701.0)
    gone.check(_state(), 701.0 + 30.0 + 31.0)
    assert gone.restored == {}


def test_no_second_victim_while_the_hosts_report_lags_the_first_ones_stop() -> None:
    s = _borrowing()
    r = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    assert [k.job_id for k in r.check(s, 701.0)] == ["r2"]
    # r2's stop comes back before h-1's report: the hosts' view still shows h-1 full
    s.event(JobEvent("r2", "preempted", 703.0, ["h-1"]), free=True)
    assert not s.view.state.fits(2, 1000, s.queued["p1"].gpu_types)
    assert r.check(s, 704.0) == []  # r1 (past its minimum run, research over) is not asked
    assert s.first == ["p1"]
    s.node(NodeStatus("h-1", "GPU", 4, [2, 3]))  # the report: p1 starts on r2's GPUs
    assert r.check(s, 705.0) == [] and s.first == ["p1"]
    batch = s.free_round(1, 705.0)
    assert batch is not None and [j for j, _ in batch.jobs][:1] == ["p1"]
    # a stop whose GPUs never show up free (taken by something else) holds p1's claim for
    # STOPPING_S only: then p1 may reclaim again
    s2 = _borrowing()
    r2 = LiveReclaim(CLUSTER, grace_s=30.0, min_run_s=600.0)
    assert [k.job_id for k in r2.check(s2, 701.0)] == ["r2"]
    s2.event(JobEvent("r2", "preempted", 703.0, ["h-1"]), free=True)
    assert r2.check(s2, 704.0) == []  # the check that sees r2 stopped
    assert r2.check(s2, 704.0 + STOPPING_S - 1.0) == []
    assert [k.job_id for k in r2.check(s2, 704.0 + STOPPING_S + 1.0)] == ["r1"]
