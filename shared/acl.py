"""Who may read and write which topic: the deployment's Kafka ACLs.

In production (compose, k8s) each service connects as a principal of its own
(SASL/SCRAM, `shared.config.KafkaSecurity`) and may write only the topics it
owns, so a message on an internal topic can come only from its owner: a user can
publish jobs and kill requests and nothing else, and no service can forge another
one's answers. This table is the one source of those rules: `k8s/users.yaml`
(Strimzi `KafkaUser`s) is rendered from it by `kafka_users`, and a test checks it
against DESIGN.md's topic table. The embedded broker (Tansu) enforces no
authentication or ACLs: there, the range and round checks on internal messages
are all that stands (see docs/design/bus.md).

Writes beyond DESIGN.md's producers, each for a reason: every service writes its
own snapshots to `metrics` and the dead letters of what it reads (`<topic>.dlq`
for internal topics, `jobs.rejected` for public ones); cluster-sim writes
`sched.rounds` (its round requests) and `jobs.submit` (a trace replay submits as
a user would); scoring writes `jobs.events` (`cancelled` for a job killed while
it waited) and `jobs.kill` (preemptions: reclaim on live hosts, a `KillRequest`
with `requeue`); a user reads `jobs.kill` (`rltune why --cluster` names the
preemptions under way).
"""

from __future__ import annotations

from typing import Any

from shared.topics import Topics

__all__ = ["PRINCIPALS", "READS", "WRITES", "kafka_users", "writes"]

# principal -> topic suffixes it produces (dead letters and metrics added by `writes`)
WRITES: dict[str, tuple[str, ...]] = {
    "user": ("jobs.submit", "jobs.kill"),
    "arrival": ("jobs.accepted",),
    "scoring": ("sched.priorities", "jobs.events", "jobs.kill"),
    "placement": ("sched.placements",),
    "telemetry": ("rl.rewards",),
    "profiler": ("offload.plans",),
    "cluster-sim": (
        "sched.rounds",
        "cluster.nodes",
        "jobs.events",
        "offload.stats",
        "jobs.submit",
    ),
    "offload-agent": ("cluster.nodes", "jobs.events", "offload.stats", "offload.profiles"),
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
        "cluster.nodes",
        "offload.stats",
        "offload.profiles",
    ),
}

PRINCIPALS = tuple(WRITES)


def writes(principal: str, topics: Topics) -> list[str]:
    """Every topic `principal` may write: what it produces, its metrics snapshots, and
    the dead letters of what it reads (a user writes only what it publishes)."""
    out = [topics.name(s) for s in WRITES[principal]]
    if principal != "user":
        out.append(topics.metrics)
        out += [topics.dead_letter(topics.name(s)) for s in READS[principal]]
    return sorted(set(out))


def reads(principal: str, topics: Topics) -> list[str]:
    out = [topics.name(s) for s in READS[principal]]
    if principal == "telemetry":  # counts every dead letter
        out += [t for t in topics.all() if t.endswith(".dlq")]
    return sorted(set(out))


def kafka_users(topics: Topics, cluster: str = "rltune") -> list[dict[str, Any]]:
    """One Strimzi `KafkaUser` per principal: SCRAM-SHA-512, simple authorization, Write
    and Describe on what it writes, Read and Describe on what it reads, Read on its
    consumer group (the services' `<prefix><name>`; users' command-line groups under
    `<prefix>cli-`). Strimzi keeps each password in a Secret of the user's name."""
    out = []
    for principal in PRINCIPALS:
        name = f"rltune-{principal}"
        acls: list[dict[str, Any]] = []
        for t in writes(principal, topics):
            acls.append(_acl("topic", t, ["Write", "Describe"]))
        for t in reads(principal, topics):
            acls.append(_acl("topic", t, ["Read", "Describe"]))
        group = f"{topics.prefix}cli-" if principal == "user" else f"{topics.prefix}{principal}"
        acls.append(_acl("group", group, ["Read"], prefix=principal == "user"))
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
