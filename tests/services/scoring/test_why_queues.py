"""`rltune why` names the queue rule that holds a waiting job (services/scoring/why.py),
on hand-made states of a cluster file with two orgs, limits, guarantees and priority
classes; each expected answer is worked out by hand in the comments."""

from __future__ import annotations

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
    msgs += [(T.jobs_accepted, j) for j in waiting]
    order = [(j.job_id, float(len(waiting) - i)) for i, j in enumerate(waiting)]
    msgs.append((T.sched_priorities, PriorityBatch(1, 100.0, order)))
    msgs += list(extra)
    for i, (topic, msg) in enumerate(msgs):
        s.add(Record(topic, 0, i, None, encode(msg)))
    return s


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
