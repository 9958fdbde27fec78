# Rendered from shared/acl.py by `python -m shared.acl compose > compose/kafka-acls.sh`;
# tests/deploy/test_compose_acl.py fails when it drifts from that table.
# Sourced by the kafka-acls step of compose/docker-compose.acl.yml, which defines
# `user NAME` (SCRAM-SHA-512 credentials from /run/secrets/NAME, kafka-configs.sh) and
# `acl ARGS...` (kafka-acls.sh --add ARGS as the admin). One Kafka user per
# principal; each may write only the topics it owns (users: jobs.submit, jobs.kill).

user rltune-user
user rltune-arrival
user rltune-scoring
user rltune-placement
user rltune-telemetry
user rltune-ledger
user rltune-profiler
user rltune-cluster-sim
user rltune-offload-agent
acl --allow-principal User:rltune-user \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.jobs.kill \
    --topic rltune.jobs.submit
acl --allow-principal User:rltune-user \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.jobs.accepted \
    --topic rltune.jobs.events \
    --topic rltune.jobs.kill \
    --topic rltune.jobs.rejected \
    --topic rltune.metrics \
    --topic rltune.sched.priorities
acl --allow-principal User:rltune-user \
    --operation Read \
    --resource-pattern-type prefixed \
    --group rltune.cli-
acl --allow-principal User:rltune-arrival \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.accepted \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.metrics
acl --allow-principal User:rltune-arrival \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.accepted \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.jobs.submit
acl --allow-principal User:rltune-arrival \
    --operation Read \
    --resource-pattern-type literal \
    --group rltune.arrival
acl --allow-principal User:rltune-scoring \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.kill \
    --topic rltune.jobs.rejected \
    --topic rltune.metrics \
    --topic rltune.rl.rewards.dlq \
    --topic rltune.sched.placements.dlq \
    --topic rltune.sched.priorities \
    --topic rltune.sched.priorities.dlq \
    --topic rltune.sched.rounds.dlq
acl --allow-principal User:rltune-scoring \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.accepted \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.kill \
    --topic rltune.jobs.rejected \
    --topic rltune.rl.rewards \
    --topic rltune.rl.rewards.dlq \
    --topic rltune.sched.placements \
    --topic rltune.sched.placements.dlq \
    --topic rltune.sched.priorities \
    --topic rltune.sched.priorities.dlq \
    --topic rltune.sched.rounds \
    --topic rltune.sched.rounds.dlq \
    --topic rltune.ledger-usage-changelog
acl --allow-principal User:rltune-scoring \
    --operation Read \
    --resource-pattern-type literal \
    --group rltune.scoring
acl --allow-principal User:rltune-placement \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.metrics \
    --topic rltune.sched.placements \
    --topic rltune.sched.placements.dlq \
    --topic rltune.sched.priorities.dlq \
    --topic rltune.sched.rounds.dlq
acl --allow-principal User:rltune-placement \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.accepted \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.sched.placements \
    --topic rltune.sched.placements.dlq \
    --topic rltune.sched.priorities \
    --topic rltune.sched.priorities.dlq \
    --topic rltune.sched.rounds \
    --topic rltune.sched.rounds.dlq
acl --allow-principal User:rltune-placement \
    --operation Read \
    --resource-pattern-type literal \
    --group rltune.placement
acl --allow-principal User:rltune-telemetry \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.metrics \
    --topic rltune.offload.stats.dlq \
    --topic rltune.rl.rewards \
    --topic rltune.rl.rewards.dlq \
    --topic rltune.sched.placements.dlq
acl --allow-principal User:rltune-telemetry \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.accepted \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.exits.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.metrics \
    --topic rltune.offload.plans.dlq \
    --topic rltune.offload.profiles.dlq \
    --topic rltune.offload.stats \
    --topic rltune.offload.stats.dlq \
    --topic rltune.rl.rewards \
    --topic rltune.rl.rewards.dlq \
    --topic rltune.sched.placements \
    --topic rltune.sched.placements.dlq \
    --topic rltune.sched.priorities.dlq \
    --topic rltune.sched.rounds.dlq
acl --allow-principal User:rltune-telemetry \
    --operation Read \
    --resource-pattern-type literal \
    --group rltune.telemetry
acl --allow-principal User:rltune-ledger \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.metrics
acl --allow-principal User:rltune-ledger \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.jobs.accepted \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected
acl --allow-principal User:rltune-ledger \
    --operation Create \
    --operation Read \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.ledger-jobs-changelog \
    --topic rltune.ledger-usage-changelog \
    --topic rltune.ledger-__assignor-__leader
acl --allow-principal User:rltune-ledger \
    --operation Read \
    --resource-pattern-type literal \
    --group rltune.ledger
acl --allow-principal User:rltune-profiler \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.metrics \
    --topic rltune.offload.plans \
    --topic rltune.offload.plans.dlq \
    --topic rltune.offload.profiles.dlq
acl --allow-principal User:rltune-profiler \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.offload.plans \
    --topic rltune.offload.plans.dlq \
    --topic rltune.offload.profiles \
    --topic rltune.offload.profiles.dlq
acl --allow-principal User:rltune-profiler \
    --operation Read \
    --resource-pattern-type literal \
    --group rltune.profiler
acl --allow-principal User:rltune-cluster-sim \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.jobs.submit \
    --topic rltune.metrics \
    --topic rltune.offload.stats \
    --topic rltune.offload.stats.dlq \
    --topic rltune.sched.placements.dlq \
    --topic rltune.sched.priorities.dlq \
    --topic rltune.sched.rounds \
    --topic rltune.sched.rounds.dlq
acl --allow-principal User:rltune-cluster-sim \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.jobs.submit \
    --topic rltune.offload.stats \
    --topic rltune.offload.stats.dlq \
    --topic rltune.sched.placements \
    --topic rltune.sched.placements.dlq \
    --topic rltune.sched.priorities \
    --topic rltune.sched.priorities.dlq \
    --topic rltune.sched.rounds \
    --topic rltune.sched.rounds.dlq
acl --allow-principal User:rltune-cluster-sim \
    --operation Read \
    --resource-pattern-type literal \
    --group rltune.cluster-sim
acl --allow-principal User:rltune-offload-agent \
    --operation Write \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.exits \
    --topic rltune.jobs.exits.dlq \
    --topic rltune.jobs.rejected \
    --topic rltune.metrics \
    --topic rltune.offload.plans.dlq \
    --topic rltune.offload.profiles \
    --topic rltune.offload.profiles.dlq \
    --topic rltune.offload.stats \
    --topic rltune.offload.stats.dlq \
    --topic rltune.sched.placements.dlq
acl --allow-principal User:rltune-offload-agent \
    --operation Read \
    --operation Describe \
    --resource-pattern-type literal \
    --topic rltune.cluster.nodes \
    --topic rltune.cluster.nodes.dlq \
    --topic rltune.jobs.accepted \
    --topic rltune.jobs.events \
    --topic rltune.jobs.events.dlq \
    --topic rltune.jobs.exits \
    --topic rltune.jobs.exits.dlq \
    --topic rltune.jobs.kill \
    --topic rltune.jobs.rejected \
    --topic rltune.offload.plans \
    --topic rltune.offload.plans.dlq \
    --topic rltune.offload.profiles \
    --topic rltune.offload.profiles.dlq \
    --topic rltune.offload.stats \
    --topic rltune.offload.stats.dlq \
    --topic rltune.sched.placements \
    --topic rltune.sched.placements.dlq
acl --allow-principal User:rltune-offload-agent \
    --operation Read \
    --resource-pattern-type prefixed \
    --group rltune.offload-agent.
