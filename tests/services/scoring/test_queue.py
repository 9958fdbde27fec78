"""The scoring service's queue: driven rounds wait for what they name and apply it in
the simulator's order; free rounds follow the events."""

from __future__ import annotations

import pytest

from services.scoring.policies import make_policy
from services.scoring.queue import ScoringState
from shared.cluster import ClusterSpec, NodeSpec
from shared.messages import Job, JobEvent, NodeStatus, RoundRequest
from shared.policy_api import History, QueuedJob

CLUSTER = ClusterSpec("t", (NodeSpec("a", "V100", 4),))


def _jobs(n: int) -> list[Job]:
    return [Job(f"j{i}", 1 + i % 2, float(i), user=f"u{i % 2}") for i in range(n)]


def test_a_round_waits_for_its_jobs_finishes_and_nodes() -> None:
    s = ScoringState(make_policy("fifo"), CLUSTER)
    jobs = _jobs(3)
    s.request(RoundRequest(0, 5.0, arrived=["j0", "j1", "j2"], nodes=["a"]))
    assert s.answer_rounds() == []
    for j in jobs:
        s.accepted(j, free=False)
    assert s.answer_rounds() == []  # the node status of round 0 is still missing
    assert s.waiting_for(s.rounds.pending[0]) == ["node a"]
    s.node(NodeStatus("a", "V100", 4, [0, 1, 2, 3], round_id=0))
    (batch,) = s.answer_rounds()
    assert batch.round_id == 0 and batch.driven
    assert [j for j, _ in batch.jobs] == ["j0", "j1", "j2"]
    assert [score for _, score in batch.jobs] == [3.0, 2.0, 1.0]
    # round 1: j0 started, then finished; its run time must come from the events
    s.request(RoundRequest(1, 50.0, started=["j0"], finished=["j0"]))
    assert s.answer_rounds() == []
    s.event(JobEvent("j0", "started", 5.0), free=False)
    s.event(JobEvent("j0", "finished", 45.5), free=False)
    (batch,) = s.answer_rounds()
    assert [j for j, _ in batch.jobs] == ["j1", "j2"]
    assert s.history.mean_run("u0", 1) == 40.5
    assert s.answer_rounds() == []  # answered once; an old round asked again is not re-applied
    s.request(RoundRequest(1, 50.0, started=["j0"], finished=["j0"]))
    assert [b.round_id for b in s.answer_rounds()] == [1]
    assert s.queue_length == 2


def test_history_sums_in_the_order_the_round_names() -> None:
    """Finishes enter the running means in the simulator's order, not the events'."""
    s = ScoringState(make_policy("sjf-est"), CLUSTER)
    runs = [0.1, 0.2, 0.3]
    ids = [f"j{i}" for i in range(3)]
    for jid in ids:
        s.accepted(Job(jid, 1, 0.0, user="u"), free=False)
    s.request(RoundRequest(0, 0.0, arrived=ids))
    s.answer_rounds()
    for jid, r in reversed(list(zip(ids, runs, strict=True))):  # events in another order
        s.event(JobEvent(jid, "started", 0.0), free=False)
        s.event(JobEvent(jid, "finished", r), free=False)
    s.request(RoundRequest(1, 1.0, started=ids, finished=ids))
    s.answer_rounds()
    ref = History()
    for i, r in enumerate(runs):
        ref.record(QueuedJob(i, ids[i], 0.0, 1, user="u"), r)
    assert s.history.mean_run("u", 1) == ref.mean_run("u", 1)


def test_free_rounds_follow_events_placements_and_refusals() -> None:
    s = ScoringState(make_policy("fifo"), None)
    s.node(NodeStatus("h", "V100", 2, [0, 1]))
    for j in _jobs(3):
        s.accepted(j, free=True)
    batch = s.free_round(0, 0.0)
    assert batch is not None and [j for j, _ in batch.jobs] == ["j0", "j1", "j2"]
    s.placed(["j0"])  # given GPUs: out of the window
    assert [j for j, _ in s.free_round(1, 0.0).jobs] == ["j1", "j2"]  # type: ignore[union-attr]
    s.event(JobEvent("j0", "rejected_placement", 1.0), free=True)  # back to the queue
    assert [j for j, _ in s.free_round(2, 0.0).jobs] == ["j0", "j1", "j2"]  # type: ignore[union-attr]
    s.event(JobEvent("j1", "started", 2.0), free=True)
    s.event(JobEvent("j1", "finished", 12.0), free=True)
    assert [j for j, _ in s.free_round(3, 0.0).jobs] == ["j0", "j2"]  # type: ignore[union-attr]
    assert s.history.mean_run("u1", 2) == 10.0


def test_free_rounds_pipeline_k_new_jobs_while_offers_are_in_flight() -> None:
    """An offer whose PlacementBatch has not come back stays in the window in its place
    in the order but does not count against K: every round brings K new jobs (checked
    against the queue in FIFO order, computed independently here)."""
    s = ScoringState(make_policy("fifo"), None, window=4)
    s.node(NodeStatus("h", "V100", 64, list(range(64))))
    ids = [f"j{i}" for i in range(20)]
    for i, jid in enumerate(ids):
        s.accepted(Job(jid, 1, float(i)), free=True)
    seen: list[list[str]] = []
    for rid in range(3):  # no answers yet: 4, 8, 12 jobs, the oldest first
        b = s.free_round(rid, 0.1 * rid)
        assert b is not None
        seen.append([j for j, _ in b.jobs])
    assert seen == [ids[:4], ids[:8], ids[:12]]
    s.placed(["j0", "j1", "j2", "j3", "j4", "j5"], round_id=1)  # j6, j7 not placed
    b = s.free_round(3, 0.3)  # round 2's offers still fly; j6, j7 count against K again
    assert b is not None and [j for j, _ in b.jobs] == ids[6:14]
    assert [score for _, score in b.jobs] == sorted((score for _, score in b.jobs), reverse=True)
    b = s.free_round(4, 0.3 + 2.5)  # every offer older than INFLIGHT_S: back to K
    assert b is not None and [j for j, _ in b.jobs] == ids[6:10]


def test_a_job_killed_while_queued_never_runs_and_teaches_no_run_time() -> None:
    """Free rounds: a cancelled job leaves the window at once and for good (a
    redelivered accepted record does not bring it back); a failed event for a job
    that never started (another replica's kill, or the host refusing a killed job it
    was placed on) does the same, giving back what the placement held; after a
    restart the rebuilt queue leaves it out and its history has no run time of it."""
    s = ScoringState(make_policy("fifo"), None)
    s.node(NodeStatus("h", "V100", 8, list(range(8))))
    jobs = _jobs(4)
    for j in jobs:
        s.accepted(j, free=True)
    assert s.where("j1") == "queued" and s.where("nope") == "unknown"
    assert s.cancel("j1") and not s.cancel("j1")  # (the second time it is not waiting)
    assert s.where("j1") == "ended"
    s.accepted(jobs[1], free=True)
    assert [j for j, _ in s.free_round(0, 0.0).jobs] == ["j0", "j2", "j3"]  # type: ignore[union-attr]
    s.placed(["j2"])
    assert s.where("j2") == "placed" and s.vc_held == {"": 1.0}
    s.event(JobEvent("j2", "failed", 1.0, ["h"], "killed before it started"), free=True)
    assert s.where("j2") == "ended" and s.vc_held == {"": 0.0}
    s.event(JobEvent("j0", "started", 1.0), free=True)
    assert not s.cancel("j0")  # running: the host agent's to stop
    s.event(JobEvent("j0", "finished", 11.0), free=True)
    assert [j for j, _ in s.free_round(1, 0.0).jobs] == ["j3"]  # type: ignore[union-attr]
    assert s.counts["cancelled"] == 2
    # a restart: the same records read back, then rebuilt
    r = ScoringState(make_policy("fifo"), None)
    r.node(NodeStatus("h", "V100", 8, list(range(8))))
    for j in jobs:
        r.accepted(j, free=False)
    for ev in [
        JobEvent("j1", "cancelled", 0.5, [], "killed while queued"),
        JobEvent("j2", "failed", 1.0, ["h"], "killed before it started"),
        JobEvent("j0", "started", 1.0),
        JobEvent("j0", "finished", 11.0),
    ]:
        r.event(ev, free=False)
    r.rebuild([], -1, free=True)
    assert sorted(r.queued) == ["j3"] and r.cancelled == {"j1", "j2"}
    assert r.history.mean_run("u0", 1) == 10.0 and r.history.mean_run("u1", 2) is None


def _driven_run(
    n_jobs: int, seed: int
) -> tuple[list[Job], list[tuple[RoundRequest, list[JobEvent]]]]:
    """A random driven run on one 4-GPU node: per round, the jobs that arrived, started
    and finished (a started job finishes some rounds later), with the events the
    executor published for them (as the simulator names them: a job starts in a round
    after the one it arrived in)."""
    import random

    rng = random.Random(seed)
    jobs = [Job(f"j{i}", rng.choice([1, 1, 2]), float(i), user=f"u{i % 3}") for i in range(n_jobs)]
    rounds: list[tuple[RoundRequest, list[JobEvent]]] = []
    waiting: list[str] = []
    running: dict[str, int] = {}  # job -> round it finishes in
    t, nxt, rid = 0.0, 0, 0
    while nxt < n_jobs or waiting or running:
        t += 10.0
        arrived = [j.job_id for j in jobs[nxt : nxt + rng.randint(0, 3)]]
        nxt += len(arrived)
        finished = sorted(j for j, r in running.items() if r <= rid)
        for j in finished:
            del running[j]
        # what started since the last round was placed by it: it had arrived before
        started = [waiting.pop(0) for _ in range(min(len(waiting), rng.randint(0, 2)))]
        waiting += arrived
        for j in started:
            running[j] = rid + rng.randint(1, 4)
        events = [JobEvent(j, "finished", t - rng.uniform(0, 5)) for j in finished]
        events += [JobEvent(j, "started", t) for j in started]
        rounds.append(
            (RoundRequest(rid, t, arrived=arrived, started=started, finished=finished), events)
        )
        rid += 1
    return jobs, rounds


def test_a_driven_rebuild_after_any_round_equals_the_live_state() -> None:
    """A restart at round k reads back every job, every event (finishes included) and
    the round requests, and answers round k+1 as the live state does: the same window
    order, and the run-time history a history-reading policy ranks by (the events
    mark finished jobs ended; the rebuild must still see them arrive, start and
    finish in the rounds' order)."""
    for seed in range(5):
        jobs, rounds = _driven_run(24, seed)
        live = ScoringState(make_policy("sjf-est"), CLUSTER)
        live.node(NodeStatus("a", "V100", 4, [0, 1, 2, 3]))
        for j in jobs:
            live.accepted(j, free=False)
        answers = []
        for req, events in rounds:
            for ev in events:
                live.event(ev, free=False)
            live.request(req)
            answers += live.answer_rounds()
        assert [b.round_id for b in answers] == [r.round_id for r, _ in rounds]
        for k in range(0, len(rounds) - 1, 3):
            r = ScoringState(make_policy("sjf-est"), CLUSTER)
            r.node(NodeStatus("a", "V100", 4, [0, 1, 2, 3]))
            for j in jobs:
                r.accepted(j, free=False)
            for _, events in rounds[: k + 2]:  # events may run ahead of the rounds answered
                for ev in events:
                    r.event(ev, free=False)
            r.rebuild([req for req, _ in rounds[: k + 1]], k, free=False)
            r.request(rounds[k + 1][0])
            (again,) = r.answer_rounds()
            assert again.jobs == answers[k + 1].jobs, (seed, k)
            # the history, computed from the events: every job whose finish the rounds
            # up to k+1 named, its run from its own started and finished events
            when = {(ev.job_id, ev.kind): ev.time for _, evs in rounds for ev in evs}
            done = [j for req, _ in rounds[: k + 2] for j in req.finished]
            by_id = {j.job_id: j for j in jobs}
            for who in ("u0", "u1", "u2"):
                for g in (1, 2):
                    runs = [
                        when[(j, "finished")] - when[(j, "started")]
                        for j in done
                        if by_id[j].user == who and by_id[j].num_gpus == g
                    ]
                    got = r.history.mean_run(who, g)
                    if not runs:
                        assert got is None
                    else:
                        assert got == pytest.approx(sum(runs) / len(runs)), (seed, k, who, g)
