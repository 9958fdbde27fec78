"""Prometheus metrics of a run (DESIGN.md naming), exported by the telemetry and
placement services beside the bus metrics of `shared.prom`; the Grafana
dashboard (compose/grafana/dashboards/rltune.json) plots them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = ["COLLECTORS", "GPU_UTIL", "JCT", "JOBS", "OFFLOAD_HIT", "OFFLOAD_MIGRATION", "ROUNDS"]

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
COLLECTORS = (JOBS, JCT, GPU_UTIL, ROUNDS, OFFLOAD_HIT, OFFLOAD_MIGRATION)
