"""The ledger's principal in the ACL table: it reads its inputs, owns faust's topics
(each named, as faust names them for the app id `<prefix>ledger`), and no other
principal writes them; scoring alone reads the `usage` changelog."""

from __future__ import annotations

from shared import acl
from shared.topics import Topics

T = Topics("p.")
FAUST = ["p.ledger-jobs-changelog", "p.ledger-usage-changelog", "p.ledger-__assignor-__leader"]


def _ops(principal: str, topic: str) -> set[str]:
    return {
        op
        for user in acl.kafka_users(T)
        if user["metadata"]["name"] == acl.principal_name(principal)
        for a in user["spec"]["authorization"]["acls"]
        if a["resource"] == {"type": "topic", "name": topic, "patternType": "literal"}
        for op in a["operations"]
    }


def test_ledger_reads_its_inputs_and_owns_its_faust_topics() -> None:
    assert {"Read", "Describe"} <= _ops("ledger", T.jobs_accepted)
    assert {"Read", "Describe"} <= _ops("ledger", T.jobs_events)
    assert "Write" not in _ops("ledger", T.jobs_events)
    for topic in FAUST:
        assert _ops("ledger", topic) == {"Create", "Read", "Write", "Describe"}, topic
    name, prefix = acl.group("ledger", T)
    assert (name, prefix) == ("p.ledger", False)  # faust's group is its app id


def test_only_the_ledger_writes_its_topics_and_scoring_reads_usage() -> None:
    for p in acl.PRINCIPALS:
        if p != "ledger":
            for topic in FAUST:
                assert not _ops(p, topic) & {"Write", "Create"}, (p, topic)
    readers = {p for p in acl.PRINCIPALS if "Read" in _ops(p, "p.ledger-usage-changelog")}
    assert readers == {"ledger", "scoring"}
