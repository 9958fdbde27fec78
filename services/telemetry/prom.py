"""Prometheus metrics of a run (DESIGN.md naming), exported by the telemetry and
placement services beside the bus metrics of `shared.prom`; the Grafana
dashboard (compose/grafana/dashboards/rltune.json) plots them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "COLLECTORS",
    "FAIR_SHARE",
    "GPU_UTIL",
    "JCT",
    "JOBS",
    "OFFLOAD_HIT",
    "OFFLOAD_MIGRATION",
    "PREEMPTIONS",
    "QUEUE_ALLOCATED",
    "QUEUE_BORROWED",
    "QUEUE_PENDING",
    "ROUNDS",
]

JOBS = Gauge(
    "rltune_jobs",
    "Jobs by state (ahead: accepted with a submit time past the cluster's clock;"
    " waiting, running, done, failed)",
    ["state"],
)
JCT = Histogram(
    "rltune_job_completion_seconds",
    "Job completion time: finish - submit (the cluster's clock)",
    ["queue"],
    buckets=(60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400, 30 * 86400),
)
GPU_UTIL = Gauge("rltune_gpu_utilization_ratio", "GPUs held / GPUs, now", ["gpu_type"])
ROUNDS = Counter("rltune_rounds_total", "Placement rounds solved", ["mode"])
# (the host agents export the same figures per job: rltune_offload_*{job,node})
OFFLOAD_HIT = Gauge("rltune_cluster_offload_hit_ratio", "Mean 10Cache hit rate of the running jobs")
OFFLOAD_MIGRATION = Gauge(
    "rltune_cluster_offload_migration_seconds",
    "10Cache migration latency of the running jobs (p50: mean of theirs; p99: max)",
    ["percentile"],  # not "quantile": that label is for summaries
)
# per team queue (docs/guide/tenancy.md): the queue of a job's VC, or the VC itself
# when the cluster file has no queues
QUEUE_PENDING = Gauge(
    "rltune_queue_pending_jobs", "Jobs accepted and not started yet, per queue", ["queue"]
)
QUEUE_ALLOCATED = Gauge(
    "rltune_queue_allocated_gpus", "GPUs held by the queue's running jobs", ["queue", "gpu_type"]
)
QUEUE_BORROWED = Gauge(
    "rltune_queue_borrowed_gpus",
    "GPUs the queue holds beyond its guarantee (a team's count to its org too)",
    ["queue"],
)
PREEMPTIONS = Counter(
    "rltune_preemptions_total", "Running jobs preempted, by queue and reason", ["queue", "reason"]
)
FAIR_SHARE = Gauge(
    "rltune_queue_fair_share_factor",
    "Slurm's classic fair-share factor of the queue over its decayed GPU-seconds"
    " (1: no usage, 0.5: exactly its share)",
    ["queue"],
)
COLLECTORS = (
    JOBS, JCT, GPU_UTIL, ROUNDS, OFFLOAD_HIT, OFFLOAD_MIGRATION,
    QUEUE_PENDING, QUEUE_ALLOCATED, QUEUE_BORROWED, PREEMPTIONS, FAIR_SHARE,
)  # fmt: skip
