"""Who may read and write which topic: the deployment's Kafka ACLs.

In production (compose, k8s) each service connects as a principal of its own
(SASL/SCRAM, `shared.config.KafkaSecurity`) and may write only the topics it
owns, so a message on an internal topic can come only from its owner: a user can
publish jobs and kill requests and nothing else, and no service can forge another
one's answers. This table is the one source of those rules: `k8s/users.yaml`
(Strimzi `KafkaUser`s) is rendered from it by `kafka_users`, `compose/kafka-acls.sh`
(the same ACLs as `kafka-acls.sh` commands, for the Compose overlay
`docker-compose.acl.yml`) by `compose_acls` (`python -m shared.acl compose`), and
tests check both and the table against DESIGN.md's topic table. The embedded broker
(Tansu) enforces no authentication or ACLs: there, the range and round checks on
internal messages are all that stands (see docs/design/bus.md).

Writes beyond DESIGN.md's producers, each for a reason: every service writes its
own snapshots to `metrics` and the dead letters of what it reads (`<topic>.dlq`
for internal topics, `jobs.rejected` for public ones); cluster-sim writes
`sched.rounds` (its round requests) and `jobs.submit` (a trace replay submits as
a user would); scoring writes `jobs.events` (`cancelled` for a job killed while
it waited) and `jobs.kill` (preemptions: reclaim on live hosts, a `KillRequest`
with `requeue`); a user reads `jobs.kill` (`rltune why --cluster` names the
preemptions under way); the ledger creates, writes and reads its faust topics
(`owns`: changelogs and leader topic, named one by one) and scoring reads its
`usage` changelog (`reads_owned`).
"""

from __future__ import annotations

from typing import Any

from shared.fairshare import ledger_topics, usage_changelog
from shared.topics import Topics

__all__ = [
    "PRINCIPALS",
    "READS",
    "WRITES",
    "compose_acls",
    "group",
    "kafka_users",
    "owns",
    "principal_name",
    "reads",
    "reads_owned",
    "writes",
]

# principal -> topic suffixes it produces (dead letters and metrics added by `writes`)
WRITES: dict[str, tuple[str, ...]] = {
    "user": ("jobs.submit", "jobs.kill"),
    "arrival": ("jobs.accepted",),
    "scoring": ("sched.priorities", "jobs.events", "jobs.kill"),
    "placement": ("sched.placements",),
    "telemetry": ("rl.rewards",),
    "ledger": (),  # its own topics: OWNS
    "profiler": ("offload.plans",),
    "cluster-sim": (
        "sched.rounds",
        "cluster.nodes",
        "jobs.events",
        "offload.stats",
        "jobs.submit",
    ),
    "offload-agent": (
        "cluster.nodes",
        "jobs.events",
        "jobs.exits",
        "offload.stats",
        "offload.profiles",
    ),
}

# principal -> topic suffixes it reads (inputs and what it reads back at a restart)
READS: dict[str, tuple[str, ...]] = {
    "user": (
        "jobs.rejected",
        "jobs.accepted",
        "jobs.events",
        "metrics",
        "sched.priorities",
        "jobs.kill",
    ),
    "arrival": ("jobs.submit", "jobs.accepted", "jobs.rejected", "cluster.nodes", "jobs.events"),
    "scoring": (
        "jobs.accepted",
        "jobs.rejected",
        "jobs.events",
        "cluster.nodes",
        "sched.rounds",
        "sched.placements",
        "sched.priorities",
        "jobs.kill",
        "rl.rewards",
    ),
    "placement": (
        "jobs.accepted",
        "jobs.events",
        "cluster.nodes",
        "sched.rounds",
        "sched.priorities",
        "sched.placements",
    ),
    "telemetry": (
        "jobs.accepted",
        "jobs.rejected",
        "jobs.events",
        "cluster.nodes",
        "sched.placements",
        "offload.stats",
        "metrics",
        "rl.rewards",
    ),
    "ledger": ("jobs.accepted", "jobs.events"),
    "profiler": ("offload.profiles", "offload.plans"),
    "cluster-sim": (
        "sched.rounds",
        "sched.priorities",
        "sched.placements",
        "jobs.submit",
        "jobs.events",
        "cluster.nodes",
        "offload.stats",
    ),
    "offload-agent": (
        "sched.placements",
        "offload.plans",
        "jobs.accepted",
        "jobs.events",
        "jobs.kill",
        "jobs.exits",
        "cluster.nodes",
        "offload.stats",
        "offload.profiles",
    ),
}

PRINCIPALS = tuple(WRITES)


def owns(principal: str, topics: Topics) -> list[str]:
    """Topics a principal creates and keeps itself, outside DESIGN.md's table: the
    ledger's faust topics (its tables' changelogs, its leader assignor's topic), each
    named, never a prefix."""
    return ledger_topics(topics.prefix) if principal == "ledger" else []


def reads_owned(principal: str, topics: Topics) -> list[str]:
    """Others' own topics a principal reads: scoring (`--ledger`) reads the ledger's
    `usage` changelog."""
    return [usage_changelog(topics.prefix)] if principal == "scoring" else []


def writes(principal: str, topics: Topics) -> list[str]:
    """Every topic `principal` may write: what it produces, its metrics snapshots, and
    the dead letters of what it reads (a user writes only what it publishes)."""
    out = [topics.name(s) for s in WRITES[principal]]
    if principal != "user":
        out.append(topics.metrics)
        out += [topics.dead_letter(topics.name(s)) for s in READS[principal]]
    return sorted(set(out))


def reads(principal: str, topics: Topics) -> list[str]:
    """Every topic `principal` may read: its inputs and, for a service, the dead
    letters of those inputs, which it reads back with its outputs whenever it takes
    its partitions (shared.bus: the inputs it already answered)."""
    out = [topics.name(s) for s in READS[principal]]
    if principal != "user":
        out += [topics.dead_letter(topics.name(s)) for s in READS[principal]]
    if principal == "telemetry":  # counts every dead letter
        out += [t for t in topics.all() if t.endswith(".dlq")]
    return sorted(set(out))


def principal_name(principal: str) -> str:
    """The Kafka user a principal logs in as (`User:<this>` in an ACL)."""
    return f"rltune-{principal}"


def group(principal: str, topics: Topics) -> tuple[str, bool]:
    """The consumer group(s) a principal joins, as (name, is a prefix): a service's is
    `<prefix><name>`; each host agent's is `<prefix>offload-agent.<node>`, one per
    node; users' command-line groups are under `<prefix>cli-`."""
    if principal == "user":
        return f"{topics.prefix}cli-", True
    if principal == "offload-agent":
        return f"{topics.prefix}{principal}.", True
    return f"{topics.prefix}{principal}", False


def _acls(principal: str, topics: Topics) -> list[dict[str, Any]]:
    acls = [_acl("topic", t, ["Write", "Describe"]) for t in writes(principal, topics)]
    acls += [_acl("topic", t, ["Read", "Describe"]) for t in reads(principal, topics)]
    acls += [_acl("topic", t, ["Read", "Describe"]) for t in reads_owned(principal, topics)]
    ops = ["Create", "Read", "Write", "Describe"]
    acls += [_acl("topic", t, ops) for t in owns(principal, topics)]
    name, prefix = group(principal, topics)
    acls.append(_acl("group", name, ["Read"], prefix=prefix))
    return acls


def kafka_users(topics: Topics, cluster: str = "rltune") -> list[dict[str, Any]]:
    """One Strimzi `KafkaUser` per principal: SCRAM-SHA-512, simple authorization, Write
    and Describe on what it writes, Read and Describe on what it reads, Read on its
    consumer group (`group`). Strimzi keeps each password in a Secret of the user's
    name."""
    out = []
    for principal in PRINCIPALS:
        name = principal_name(principal)
        acls = _acls(principal, topics)
        out.append(
            {
                "apiVersion": "kafka.strimzi.io/v1",
                "kind": "KafkaUser",
                "metadata": {"name": name, "labels": {"strimzi.io/cluster": cluster}},
                "spec": {
                    "authentication": {"type": "scram-sha-512"},
                    "authorization": {"type": "simple", "acls": acls},
                },
            }
        )
    return out


def _acl(kind: str, name: str, ops: list[str], prefix: bool = False) -> dict[str, Any]:
    return {
        "resource": {"type": kind, "name": name, "patternType": "prefix" if prefix else "literal"},
        "operations": ops,
    }


COMPOSE_HEADER = """\
# Rendered from shared/acl.py by `python -m shared.acl compose > compose/kafka-acls.sh`;
# tests/deploy/test_compose_acl.py fails when it drifts from that table.
# Sourced by the kafka-acls step of compose/docker-compose.acl.yml, which defines
# `user NAME` (SCRAM-SHA-512 credentials from /run/secrets/NAME, kafka-configs.sh) and
# `acl ARGS...` (kafka-acls.sh --add ARGS as the admin). One Kafka user per
# principal; each may write only the topics it owns (users: jobs.submit, jobs.kill).
"""


def compose_acls(topics: Topics) -> str:
    """`kafka_users`' principals and ACLs as the lines the Compose overlay's kafka-acls
    step runs: `user NAME` for each principal, then one `acl` line per principal,
    resource type and operation set (kafka-acls.sh takes several `--topic` and
    `--operation` flags at once; the pattern type applies to the whole line)."""
    lines = [COMPOSE_HEADER]
    lines += [f"user {principal_name(p)}" for p in PRINCIPALS]
    for p in PRINCIPALS:
        runs: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
        for a in _acls(p, topics):
            r = a["resource"]
            runs.setdefault((r["type"], r["patternType"], tuple(a["operations"])), []).append(
                r["name"]
            )
        for (kind, pattern, ops), names in runs.items():
            words = [f"--allow-principal User:{principal_name(p)}"]
            words += [f"--operation {op}" for op in ops]
            # Strimzi says `prefix`, kafka-acls.sh `prefixed`
            words.append(f"--resource-pattern-type {pattern.replace('prefix', 'prefixed')}")
            words += [f"--{kind} {n}" for n in names]
            lines.append("acl " + " \\\n    ".join(words))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args != ["compose"]:
        print("usage: python -m shared.acl compose > compose/kafka-acls.sh", file=sys.stderr)
        return 2
    sys.stdout.write(compose_acls(Topics()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
