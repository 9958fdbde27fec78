"""`rltune why` names the queue rule that holds a waiting job (services/scoring/why.py),
on hand-made states of a cluster file with two orgs, limits, guarantees and priority
classes; each expected answer is worked out by hand in the comments."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from msgspec import Struct

from services.scoring.why import WhyState
from shared.cluster import ClusterSpec, NodeSpec, PriorityClass, QueueSpec
from shared.messages import Job, JobEvent, KillRequest, NodeStatus, PriorityBatch, encode
from shared.topics import Topics
from shared.wire import Record

T = Topics("rltune.")
# 8 GPUs on two nodes; research (guarantee 4, limit 6) with teams nlp (2, limit 4) and cv
# (2); prod (4); anything else falls into `default` (no guarantee, no limit)
CLUSTER = ClusterSpec(
    "c",
    (NodeSpec("a", "GPU", 4), NodeSpec("b", "GPU", 4)),
    queues={
        "research": QueueSpec(guaranteed_gpus=4, limit_gpus=6),
        "nlp": QueueSpec(guaranteed_gpus=2, limit_gpus=4, parent="research"),
        "cv": QueueSpec(guaranteed_gpus=2, parent="research"),
        "prod": QueueSpec(guaranteed_gpus=4),
    },
    priority_classes={"serve": PriorityClass(100, False), "train": PriorityClass(10, True)},
)


def _with_round(
    s: WhyState,
    msgs: list[tuple[str, Struct]],
    waiting: Sequence[Job],
    extra: Iterable[tuple[str, Struct]],
) -> WhyState:
    """`s` fed `msgs`, then `waiting` accepted, one round at t=100 ranking them in the
    order given, and `extra`, as records in that order."""
    msgs = [*msgs, *((T.jobs_accepted, j) for j in waiting)]
    order = [(j.job_id, float(len(waiting) - i)) for i, j in enumerate(waiting)]
    msgs.append((T.sched_priorities, PriorityBatch(1, 100.0, order)))
    msgs += list(extra)
    for i, (topic, msg) in enumerate(msgs):
        s.add(Record(topic, 0, i, None, encode(msg)))
    return s


def _state(
    running: list[tuple[str, str, int, str]],
    waiting: list[Job],
    extra: list[tuple[str, Struct]] = (),  # type: ignore[assignment]
) -> WhyState:
    """`running`: (job, vc, GPUs, node) started at t=0; nodes report what they leave
    free; one round at t=100 ranks `waiting` in the order given."""
    s = WhyState(T, CLUSTER)
    msgs: list[tuple[str, Struct]] = []
    used = {"a": 0, "b": 0}
    for jid, vc, gpus, node in running:
        msgs.append((T.jobs_accepted, Job(jid, gpus, 0.0, vc=vc, priority_class="train")))
        msgs.append((T.jobs_events, JobEvent(jid, "started", 0.0, [node])))
        used[node] += gpus
    for n, u in used.items():
        msgs.append((T.cluster_nodes, NodeStatus(n, "GPU", 4, list(range(u, 4)), time=100.0)))
    return _with_round(s, msgs, waiting, extra)


def test_a_team_at_its_limit_and_an_org_at_its_limit() -> None:
    # nlp holds 4 = its limit: one more GPU would be 5 > 4
    s = _state([("n1", "nlp", 4, "a")], [Job("more", 1, 50.0, vc="nlp")])
    a = s.explain("more")
    assert a.rule == "limit"
    assert "held by a queue rule: queue nlp at its limit of 4 GPUs (queue nlp)" in a.lines
    # nlp 3 + cv 3 = 6 = research's limit: a cv job of 1 GPU would make the org 7 > 6,
    # although cv itself has no limit and 2 GPUs are free
    s = _state([("n1", "nlp", 3, "a"), ("c1", "cv", 3, "b")], [Job("cv2", 1, 50.0, vc="cv")])
    a = s.explain("cv2")
    assert a.rule == "limit" and a.free_now == 2.0
    assert "held by a queue rule: org research at its limit of 6 GPUs (queue cv)" in a.lines


def test_a_non_preemptible_job_beyond_its_queues_unused_guarantee() -> None:
    # prod holds 2 of its 4: a serve (non-preemptible) job of 3 may not borrow the third
    s = _state([("p1", "prod", 2, "a")], [Job("srv", 3, 50.0, vc="prod", priority_class="serve")])
    a = s.explain("srv")
    assert a.rule == "limit"
    assert any("non-preemptible: only 2 GPUs of prod's guarantee unused" in x for x in a.lines)
    # a train (preemptible) job of the same size is not held by the queue rules: 6 free
    s = _state([("p1", "prod", 2, "a")], [Job("trn", 3, 50.0, vc="prod", priority_class="train")])
    a = s.explain("trn")
    assert a.rule is None and a.needs_more == 0.0


def test_waiting_for_reclaim_names_the_borrowers_being_stopped() -> None:
    # every GPU held: nlp 2, cv 2 (research 4 = its guarantee), default 4 (borrowing
    # prod's idle guarantee); prod's job of 2 fits inside prod's 4 unused
    running = [
        ("n1", "nlp", 2, "a"),
        ("c1", "cv", 2, "a"),
        ("d1", "x", 2, "b"),
        ("d2", "x", 2, "b"),
    ]
    s = _state(running, [Job("p", 2, 50.0, vc="prod")])
    a = s.explain("p")
    assert (a.rule, a.free_now, a.needs_more) == ("reclaim", 0.0, 2.0)
    line = next(x for x in a.lines if x.startswith("waiting for reclaim"))
    assert "inside prod's unused guarantee (4 of 4 GPUs unused)" in line
    assert "being stopped" not in line
    # a preemption asked (jobs.kill with requeue) and not done yet: named
    kill = KillRequest("d2", "reclaim: queue prod's guarantee, for p", requeue=True, grace_s=120)
    s = _state(running, [Job("p", 2, 50.0, vc="prod")], [(T.jobs_kill, kill)])
    line = next(x for x in s.explain("p").lines if x.startswith("waiting for reclaim"))
    assert line.endswith("being stopped now: d2 (reclaim: queue prod's guarantee, for p)")
    # ... once its `preempted` event is read (any order of topics), it no longer is
    done = (T.jobs_events, JobEvent("d2", "preempted", 110.0, ["b"]))
    s = _state(running, [Job("p", 2, 50.0, vc="prod")], [done, (T.jobs_kill, kill)])
    line = next(x for x in s.explain("p").lines if x.startswith("waiting for reclaim"))
    assert "being stopped" not in line
    # a job of a queue with no guarantee is not waiting for reclaim: it only borrows
    s = _state(running, [Job("y", 2, 50.0, vc="x")])
    assert s.explain("y").rule is None


def test_behind_a_higher_priority_class() -> None:
    # full cluster; ranked: a serve job of prod first, then a train job of `default`
    running = [("d1", "x", 4, "a"), ("d2", "x", 4, "b")]
    waiting = [
        Job("hi", 8, 50.0, vc="y", priority_class="serve"),
        Job("lo", 1, 60.0, vc="y", priority_class="train"),
    ]
    a = _state(running, waiting).explain("lo")
    assert a.rule == "priority" and a.ahead == ["hi"]
    assert (
        "behind a higher priority class: 1 job(s) ranked ahead of it of a class above "
        "train still wait: hi (serve)"
    ) in a.lines
    # without a cluster file no rule is named
    plain = WhyState(T)
    for i, (topic, msg) in enumerate([(T.jobs_accepted, waiting[1])]):
        plain.add(Record(topic, 0, i, None, encode(msg)))
    assert plain.explain("lo").rule is None


# rule 5: one team of 8 GPUs (two nodes of 4) whose `urgent` class preempts lower ones;
# `pinned` is non-preemptible, of a priority between `batch` and `urgent`
RULE5 = ClusterSpec(
    "c5",
    (NodeSpec("a", "GPU", 4), NodeSpec("b", "GPU", 4)),
    queues={"team": QueueSpec(guaranteed_gpus=8, limit_gpus=8)},
    priority_classes={
        "urgent": PriorityClass(100, True, preempt_lower=True),
        "pinned": PriorityClass(50, False),
        "batch": PriorityClass(10, True),
    },
)


def _at(
    cluster: ClusterSpec,
    running: list[tuple[str, str, str, float]],
    waiting: list[Job],
    extra: list[tuple[str, Struct]] = (),  # type: ignore[assignment]
    min_run_s: float = 600.0,
) -> WhyState:
    """`running`: (job, vc, class, start), 4 GPUs each, on node a then b; the nodes
    report at t=100, and one round at t=100 ranks `waiting` in the order given."""
    s = WhyState(T, cluster, min_run_s=min_run_s)
    msgs: list[tuple[str, Struct]] = []
    for (jid, vc, cls, start), node in zip(running, "ab", strict=False):
        msgs.append((T.jobs_accepted, Job(jid, 4, 0.0, vc=vc, priority_class=cls)))
        msgs.append((T.jobs_events, JobEvent(jid, "started", start, [node])))
    for n in "ab"[len(running) :]:
        msgs.append((T.cluster_nodes, NodeStatus(n, "GPU", 4, [0, 1, 2, 3], time=100.0)))
    for n in "ab"[: len(running)]:
        msgs.append((T.cluster_nodes, NodeStatus(n, "GPU", 4, [], time=100.0)))
    return _with_round(s, msgs, waiting, extra)


URGENT = Job("u", 4, 90.0, vc="team", priority_class="urgent")


def test_waiting_for_a_priority_preemption_names_its_victims() -> None:
    # team holds 8 = its limit with two batch jobs (b1 from t=0, b2 from t=50): the urgent
    # job of 4 is held by the limit, and rule 5 stops the newer one, b2; with a minimum
    # run of 600 s, b2 may be stopped from t=50+600=650 on
    running = [("b1", "team", "batch", 0.0), ("b2", "team", "batch", 50.0)]
    a = _at(RULE5, running, [URGENT]).explain("u")
    assert (a.rule, a.victims) == ("preemption", ["b2"])
    assert (
        "waiting for a priority preemption: class urgent stops lower classes of queue team "
        "for it: b2 (batch, inside its minimum run time until t=650 s)"
    ) in a.lines
    # a minimum run of 30 s: b2 (50 s run at t=100) is past it, asked at the next check
    a = _at(RULE5, running, [URGENT], min_run_s=30.0).explain("u")
    assert a.victims == ["b2"]
    assert any(
        x.endswith("b2 (batch, past its minimum run time: asked at scoring's next check)")
        for x in a.lines
    )
    # once asked (jobs.kill with requeue, scoring's reason naming u): inside its grace
    kill = KillRequest("b2", "priority: class urgent of u", requeue=True, grace_s=30.0)
    a = _at(RULE5, running, [URGENT], [(T.jobs_kill, kill)]).explain("u")
    assert (a.rule, a.victims) == ("preemption", ["b2"])
    assert any(
        x.endswith(
            "for it: b2 (batch, being stopped: priority: class urgent of u, SIGKILL after its "
            "grace period of 30 s)"
        )
        for x in a.lines
    )
    # a batch job is not of a class that preempts: plain limit
    lo = Job("lo", 4, 90.0, vc="team", priority_class="batch")
    assert _at(RULE5, running, [lo]).explain("lo").rule == "limit"


def test_a_non_preemptible_class_is_why_nothing_can_be_stopped() -> None:
    # the older job is pinned (non-preemptible), the newer batch: rule 5 takes b2, never p1
    mixed = [("p1", "team", "pinned", 0.0), ("b2", "team", "batch", 50.0)]
    a = _at(RULE5, mixed, [URGENT]).explain("u")
    assert (a.rule, a.victims) == ("preemption", ["b2"])
    # both pinned: rule 5 has nothing it may stop; it would need the newer one, p2
    pinned = [("p1", "team", "pinned", 0.0), ("p2", "team", "pinned", 50.0)]
    a = _at(RULE5, pinned, [URGENT]).explain("u")
    assert (a.rule, a.blockers, a.victims) == ("non-preemptible", ["p2"], [])
    assert (
        "nothing can be stopped for it: priority preemption (queue team) would have to stop "
        "p2 (pinned), of a non-preemptible class"
    ) in a.lines
    # reclaim: `default` (no guarantee) runs two pinned jobs (started before `team` was
    # given its guarantee); team's batch job of 4 fits team's 8 unused, reclaim would take
    # the newer, p2, but may not
    other = ClusterSpec(
        "c6",
        RULE5.nodes,
        queues={"team": QueueSpec(guaranteed_gpus=8)},
        priority_classes=RULE5.priority_classes,
    )
    idle = [("p1", "x", "pinned", 0.0), ("p2", "x", "pinned", 50.0)]
    a = _at(other, idle, [Job("t", 4, 90.0, vc="team", priority_class="batch")]).explain("t")
    assert (a.rule, a.blockers) == ("non-preemptible", ["p2"])
    assert (
        "nothing can be stopped for it: reclaim (queue team) would have to stop p2 (pinned), "
        "of a non-preemptible class"
    ) in a.lines
    # the same with preemptible borrowers: waiting for reclaim, p2 to stop (inside its
    # minimum run time until 50 + 600)
    idle = [("p1", "x", "batch", 0.0), ("p2", "x", "batch", 50.0)]
    a = _at(other, idle, [Job("t", 4, 90.0, vc="team", priority_class="batch")]).explain("t")
    assert (a.rule, a.victims) == ("reclaim", ["p2"])
    assert any(
        x.endswith("; to stop: p2 (batch, inside its minimum run time until t=650 s)")
        for x in a.lines
    )
