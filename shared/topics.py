"""Topic names (DESIGN.md, "Topics"), all under one configurable prefix."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PUBLIC_TOPICS", "Topics"]

# suffix -> whether it is a public topic (JSON any client may read and write)
PUBLIC_TOPICS = (
    "jobs.submit",
    "jobs.rejected",
    "jobs.accepted",
    "cluster.nodes",
    "sched.priorities",
    "sched.placements",
    "sched.rounds",
    "jobs.events",
    "jobs.kill",
    "jobs.exits",
    "metrics",
    "rl.rewards",
    "offload.profiles",
    "offload.plans",
    "offload.stats",
)

# internal topics whose bad messages go to `<topic>.dlq` rather than `jobs.rejected`
_INTERNAL = (
    "cluster.nodes",
    "sched.priorities",
    "sched.placements",
    "sched.rounds",
    "jobs.events",
    "jobs.exits",
    "rl.rewards",
    "offload.profiles",
    "offload.plans",
    "offload.stats",
)


@dataclass(frozen=True, slots=True)
class Topics:
    prefix: str = "rltune."

    def name(self, suffix: str) -> str:
        return f"{self.prefix}{suffix}"

    @property
    def jobs_submit(self) -> str:
        return self.name("jobs.submit")

    @property
    def jobs_rejected(self) -> str:
        return self.name("jobs.rejected")

    @property
    def jobs_accepted(self) -> str:
        return self.name("jobs.accepted")

    @property
    def cluster_nodes(self) -> str:
        return self.name("cluster.nodes")

    @property
    def sched_priorities(self) -> str:
        return self.name("sched.priorities")

    @property
    def sched_placements(self) -> str:
        return self.name("sched.placements")

    @property
    def sched_rounds(self) -> str:
        return self.name("sched.rounds")

    @property
    def jobs_events(self) -> str:
        return self.name("jobs.events")

    @property
    def jobs_kill(self) -> str:
        return self.name("jobs.kill")

    @property
    def jobs_exits(self) -> str:
        """Host agents' own record of a process of a job given several nodes that
        exited 0 (`NodeExit`): the job is `finished` once every node's has."""
        return self.name("jobs.exits")

    @property
    def metrics(self) -> str:
        return self.name("metrics")

    @property
    def rl_rewards(self) -> str:
        return self.name("rl.rewards")

    @property
    def offload_profiles(self) -> str:
        return self.name("offload.profiles")

    @property
    def offload_plans(self) -> str:
        return self.name("offload.plans")

    @property
    def offload_stats(self) -> str:
        return self.name("offload.stats")

    def dead_letter(self, topic: str) -> str:
        """Where a bad message read from `topic` goes: `jobs.rejected` for the public
        input topic, `<topic>.dlq` for internal ones."""
        suffix = topic[len(self.prefix) :] if topic.startswith(self.prefix) else topic
        if suffix in _INTERNAL:
            return f"{topic}.dlq"
        return self.jobs_rejected

    def all(self) -> list[str]:
        """Every topic a full deployment uses, dead-letter topics included."""
        names = [self.name(s) for s in PUBLIC_TOPICS]
        return names + [self.name(s) + ".dlq" for s in _INTERNAL]
