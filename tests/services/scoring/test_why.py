"""`rltune why`: the answer for a hand-built cluster whose expected starts are worked
out by hand, every state a job can be in, and the ETA profile against a brute-force
time-grid computation on random instances."""

from __future__ import annotations

import math
import random

import pytest
from msgspec import Struct

from services.scoring.why import WhyState, eta_profile
from shared.messages import (
    Assignment,
    Job,
    JobEvent,
    NodeStatus,
    PlacementBatch,
    PriorityBatch,
    Rejection,
    encode,
)
from shared.topics import Topics
from shared.wire import Record

T = Topics("rltune.")


def _state(*msgs: tuple[str, Struct]) -> WhyState:
    s = WhyState(T)
    for i, (topic, msg) in enumerate(msgs):
        s.add(Record(topic, 0, i, None, encode(msg)))
    return s


def _cluster() -> list[tuple[str, Struct]]:
    """Nodes a (8 V100), b (4 V100), c (4 P100). History: u's 4-GPU job ran 100 s, w's
    2-GPU job 400 s. Running: r1 (u, 4 on a, since 950: ends 1050 by estimate), r3
    (u, 4 on a, since 1000: 1100), r2 (w, 2 on b, since 900: 1300), r4 (w, 2 on b,
    since 990: 1390). Round 7 at t=1000 ranks q1 (u, 4 V100), target (w, 8 V100), q3."""
    a, v, ev = T.jobs_accepted, T.cluster_nodes, T.jobs_events
    out: list[tuple[str, Struct]] = [
        (v, NodeStatus("a", "V100", 8, [], time=1000.0)),
        (v, NodeStatus("b", "V100", 4, [], time=1000.0)),
        (v, NodeStatus("c", "P100", 4, [0, 1, 2, 3], time=1000.0)),
    ]
    jobs = [
        Job("h1", 4, 0.0, user="u"), Job("h2", 2, 0.0, user="w"),
        Job("r1", 4, 900.0, user="u"), Job("r2", 2, 850.0, user="w"),
        Job("r3", 4, 900.0, user="u"), Job("r4", 2, 900.0, user="w"),
        Job("q1", 4, 960.0, user="u", gpu_types=["V100"]),
        Job("target", 8, 970.0, user="w", gpu_types=["V100"]),
        Job("q3", 1, 980.0, user="u"),
    ]  # fmt: skip
    out += [(a, j) for j in jobs]
    spans: list[tuple[str, float, float | None, str]] = [
        ("h1", 0.0, 100.0, "a"), ("h2", 0.0, 400.0, "b"), ("r1", 950.0, None, "a"),
        ("r2", 900.0, None, "b"), ("r3", 1000.0, None, "a"), ("r4", 990.0, None, "b"),
    ]  # fmt: skip
    for jid, start, end, node in spans:
        out.append((ev, JobEvent(jid, "started", start, [node])))
        if end is not None:
            out.append((ev, JobEvent(jid, "finished", end, [node])))
    out.append(
        (T.sched_priorities, PriorityBatch(7, 1000.0, [("q1", 3), ("target", 2), ("q3", 1)]))
    )
    return out


def test_a_waiting_job_worked_out_by_hand() -> None:
    s = _state(*_cluster())
    a = s.explain("target")
    assert (a.state, a.now, a.rank, a.ahead) == ("waiting", 1000.0, 2, ["q1"])
    assert (a.free_now, a.needs_more) == (0.0, 8.0)
    # alone: V100s come back 4 at 1050 (r1), 4 more at 1100 (r3) -> 8 at 1100
    assert a.eta_alone_s == 1100.0
    # q1 first takes 4 from 1050 to 1150; then 8 are free from 1150 on, for w's 400 s
    assert a.eta_s == 1150.0
    text = "\n".join(a.lines)
    assert "ranked 2 of 3 in round 7" in text and "q1 (4 GPUs)" in text
    assert "it would start with 8 more" in text
    assert "r1 (4 GPUs on a, ends in about 50 s); r3 (4 GPUs on a, ends in about 100 s)" in text
    assert "in 2 min (t=1150 s) with the jobs ranked ahead served first" in text
    assert "other types have room" not in text  # 4 P100s free < 8
    q3 = s.explain("q3")  # 1 GPU of any type: P100s are free now
    assert (q3.free_now, q3.needs_more, q3.eta_alone_s) == (4.0, 0.0, 1000.0)
    assert "the free GPUs would hold it now (4 of its types free)" in "\n".join(q3.lines)


def test_every_other_state() -> None:
    msgs = _cluster()
    msgs += [
        (T.jobs_rejected, Rejection("bad", "num_gpus must be positive", "{}")),
        (T.jobs_accepted, Job("p", 1, 990.0, user="u")),
        (T.sched_placements, PlacementBatch(8, 1001.0, [Assignment("p", "c", [0])])),
        (T.jobs_accepted, Job("k", 2, 995.0)),
        (T.jobs_events, JobEvent("k", "failed", 1002.0, [], "killed while queued (x)")),
        (T.jobs_accepted, Job("huge", 64, 999.0, gpu_types=["V100"])),
    ]
    s = _state(*msgs)
    assert s.explain("nope").state == "unknown"
    bad = s.explain("bad")
    assert bad.state == "rejected" and "num_gpus must be positive" in bad.lines[0]
    assert s.explain("p").state == "placed" and "given GPUs on c" in s.explain("p").lines[0]
    k = s.explain("k")
    assert k.state == "failed" and k.lines == [
        "k failed without ever starting: killed while queued (x)"
    ]
    h1 = s.explain("h1")
    assert h1.state == "finished" and "waited 0 s, JCT 100 s" in h1.lines[0]
    r3 = s.explain("r3")
    assert r3.state == "running" and "ends in 98 s" in r3.lines[0]  # est 100 s, 2 s in
    huge = s.explain("huge")
    assert huge.eta_s is None and "can never start" in huge.lines[-1]  # 12 V100s in all


def test_a_job_ahead_of_the_clock_a_cancelled_one_and_one_no_round_has_seen() -> None:
    """The cluster's clock is 1002 (the latest message): a job submitted for 5000 is
    ahead of it; a job cancelled while queued says so; a job that fits but no round
    has ranked yet is not said to be ranked."""
    msgs = _cluster()
    msgs += [
        (T.jobs_accepted, Job("later", 1, 5000.0)),
        (T.jobs_accepted, Job("gone", 1, 996.0)),
        (T.jobs_events, JobEvent("gone", "cancelled", 1002.0, [], "killed while queued")),
        (T.jobs_accepted, Job("fresh", 1, 1001.0, gpu_types=["P100"])),
    ]
    s = _state(*msgs)
    later = s.explain("later")
    assert later.state == "ahead" and later.lines == [
        "later is submitted for t=5000 s, 67 min ahead of the cluster's clock (t=1002 s): "
        "no round considers it before the clock gets there"
    ]
    gone = s.explain("gone")
    assert gone.state == "cancelled"
    assert gone.lines == ["gone cancelled without ever starting: killed while queued"]
    fresh = s.explain("fresh")
    assert fresh.state == "waiting" and fresh.rank is None
    assert "no round has ranked it yet" in fresh.lines
    assert fresh.lines[-2].endswith("no round has seen it yet: the next one should place it")


def _grid(now: int, free: int, rel: list[tuple[int, int]], ahead: list[tuple[int, int]],
          need: int, dur: int, horizon: int) -> float:  # fmt: skip
    """The same schedule on a one-second grid: free GPUs per second, each job in order
    taking the first window of its length with enough free in every second."""
    level = [free] * horizon
    for t, g in rel:
        for x in range(max(t, now) - now, horizon):
            level[x] += g

    def first(n: int, d: int) -> int | None:
        for x in range(horizon - max(d, 1)):
            if all(level[y] >= n for y in range(x, x + max(d, 1))):
                return x
        return None

    for n, d in ahead:
        at = first(n, d)
        if at is not None:
            for y in range(at, at + d):
                level[y] -= n
    start = first(need, dur)
    return math.inf if start is None else float(now + start)


@pytest.mark.parametrize("seed", range(200))
def test_eta_profile_matches_a_time_grid(seed: int) -> None:
    rng = random.Random(seed)
    now, horizon = 100, 1000
    free = rng.randint(0, 4)
    rel = [(rng.randint(90, 200), rng.randint(1, 4)) for _ in range(rng.randint(0, 6))]
    ahead = [(rng.randint(1, 8), rng.randint(1, 60)) for _ in range(rng.randint(0, 5))]
    need, dur = rng.randint(1, 10), rng.randint(1, 60)
    total = free + sum(g for _, g in rel)
    releases = [(float(t), float(g)) for t, g in rel]
    jobs = [(float(n), float(d)) for n, d in ahead]
    got = eta_profile(float(now), float(free), releases, jobs, float(need), float(dur))
    want = _grid(now, free, rel, [(n, d) for n, d in ahead if n <= total], need, dur, horizon)
    assert got == want, (seed, got, want)


def test_past_their_estimates_is_said_not_hidden() -> None:
    """Once every running job has overrun its estimate, the estimates say "now" (as EASY
    reserves): the answer says that this is all they can say."""
    s = _state(*_cluster(), (T.cluster_nodes, NodeStatus("c", "P100", 4, [], time=2000.0)))
    a = s.explain("target")
    assert (a.now, a.eta_alone_s, a.needs_more) == (2000.0, 2000.0, 8.0)
    assert a.lines[-1].startswith("(the running jobs it waits for are past their estimates")


def test_a_live_cluster_waits_until_now_and_a_simulated_one_until_its_last_message() -> None:
    """Live: the accepted job's time is its broker timestamp (wall clock), so with no
    other message it has waited until the wall clock's now, not 0 s. Simulated: message
    times are virtual (years from the broker's), the latest one stays the present."""
    from shared.messages import Job

    live = WhyState(T)
    live.add(Record(T.jobs_accepted, 0, 0, None, encode(Job("j", 1, 1_700_000_000.0)),
                    timestamp_ms=1_700_000_000_400))  # fmt: skip
    live.present(1_700_000_015.0)
    assert "(15 s)" in live.explain("j").lines[0]
    sim = WhyState(T)
    sim.add(Record(T.jobs_accepted, 0, 0, None, encode(Job("j", 1, 1_504_000_000.0)),
                   timestamp_ms=1_700_000_000_400))  # fmt: skip
    sim.add(Record(T.cluster_nodes, 0, 1, None,
                   encode(NodeStatus("a", "V100", 8, [], time=1_504_000_060.0)),
                   timestamp_ms=1_700_000_000_500))  # fmt: skip
    sim.present(1_700_000_015.0)
    assert "(60 s)" in sim.explain("j").lines[0]
