"""The ACL table (shared/acl.py) against DESIGN.md's topic table, read from the file:
every producer it names may write its topic and every consumer read it; a user can
write only `jobs.submit` and `jobs.kill`; no internal topic is writable by anyone but
the principals that produce it."""

from __future__ import annotations

import re

import pytest

from shared import acl
from shared.topics import Topics
from tests.paths import SHARED

DESIGN = SHARED / "DESIGN.md"
T = Topics()
NAMES = {  # DESIGN.md's words for who produces and consumes -> principals
    "users": ["user"],
    "rltune submit": ["user"],
    "trace replay": ["cluster-sim", "user"],  # lockstep: cluster-sim; `rltune up`: a user
    "arrival": ["arrival"],
    "scoring": ["scoring"],
    "placement": ["placement"],
    "telemetry": ["telemetry"],
    "profiler": ["profiler"],
    "cluster_sim": ["cluster-sim"],
    "offload agent": ["offload-agent"],
    "any service": [],  # a dead letter: what each service reads decides (acl.writes)
}


def _design_rows() -> list[tuple[str, list[str], list[str]]]:
    if not DESIGN.is_file():
        pytest.skip(f"{DESIGN} is not beside the checkout")
    rows = []
    for line in DESIGN.read_text().splitlines():
        m = re.match(r"^\| `([a-z.]+)` \|.*\| ([^|]*→[^|]*) \|$", line)
        if not m:
            continue
        producers, consumers = m.group(2).split("→")
        rows.append((m.group(1), _who(producers), _who(consumers)))
    assert len(rows) >= 12  # the table is there and parsed
    return rows


def _who(words: str) -> list[str]:
    out: list[str] = []
    for w in re.split(r",|/", re.sub(r"\(.*?\)", "", words.replace("`", ""))):
        w = w.strip()
        assert w in NAMES, f"DESIGN.md names {w!r}: map it to a principal"
        out += NAMES[w]
    return out


def test_every_design_producer_may_write_and_consumer_read() -> None:
    for topic, producers, consumers in _design_rows():
        name = T.name(topic)
        for p in producers:
            assert name in acl.writes(p, T), (p, topic)
        for c in consumers:
            assert name in acl.reads(c, T), (c, topic)


def test_users_write_only_what_they_publish() -> None:
    assert acl.writes("user", T) == sorted([T.jobs_submit, T.jobs_kill])
    assert T.sched_placements not in acl.writes("user", T)


def test_internal_topics_are_written_by_their_producers_alone() -> None:
    """Each internal topic is writable only by the principals that produce it (its
    dead-letter topic by those that read it)."""
    design = {topic: set(p) for topic, p, _ in _design_rows()}
    for suffix in ("sched.priorities", "sched.placements", "offload.plans", "rl.rewards"):
        writers = {p for p in acl.PRINCIPALS if T.name(suffix) in acl.writes(p, T)}
        assert writers == design[suffix], suffix
    writers = {p for p in acl.PRINCIPALS if T.sched_rounds in acl.writes(p, T)}
    assert writers == {"cluster-sim"}


def test_services_may_read_back_the_dead_letters_they_write() -> None:
    """A service reads the dead letters of its inputs back at every start (the inputs
    it already answered, shared.bus); under enforced ACLs a denied read-back would stall
    it. The host agent's, as its log lists them at start."""
    agent = {
        "rltune.offload.plans.dlq", "rltune.jobs.exits.dlq", "rltune.sched.placements.dlq",
        "rltune.jobs.rejected", "rltune.jobs.events.dlq",
    }  # fmt: skip
    assert agent <= set(acl.reads("offload-agent", T))
    for p in acl.PRINCIPALS:
        if p == "user":
            continue
        dead = {t for t in acl.writes(p, T) if t.endswith(".dlq") or t == T.jobs_rejected}
        assert dead <= set(acl.reads(p, T)), p
