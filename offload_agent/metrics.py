"""Prometheus gauges the host agent sets from each `OffloadStats` it relays
(DESIGN.md naming: `rltune_` prefix, base units)."""

from __future__ import annotations

from prometheus_client import Gauge

from shared.messages import OffloadStats

__all__ = ["observe"]

_LABELS = ["job", "node"]
HIT_RATIO = Gauge(
    "rltune_offload_hit_ratio", "Fast-tier hit rate of a job's tensor accesses", _LABELS
)
MIGRATION = Gauge(
    "rltune_offload_migration_seconds", "Copy latency per migration", [*_LABELS, "quantile"]
)
MOVED = Gauge(
    "rltune_offload_moved_bytes", "Bytes moved into / out of the fast tier", [*_LABELS, "direction"]
)
STEP = Gauge("rltune_offload_step_seconds", "Mean training step time under offload", _LABELS)
UTIL = Gauge("rltune_offload_memory_utilisation_ratio", "Buffer bytes / budget", [*_LABELS, "tier"])


def observe(st: OffloadStats) -> None:
    labels = (st.job_id, st.node_id)
    HIT_RATIO.labels(*labels).set(st.hit_rate)
    MIGRATION.labels(*labels, "0.5").set(st.migration_ms_p50 / 1e3)
    MIGRATION.labels(*labels, "0.99").set(st.migration_ms_p99 / 1e3)
    MOVED.labels(*labels, "in").set(st.bytes_in)
    MOVED.labels(*labels, "out").set(st.bytes_out)
    STEP.labels(*labels).set(st.step_ms / 1e3)
    UTIL.labels(*labels, "gpu").set(st.gpu_mem_util)
    UTIL.labels(*labels, "host").set(st.host_mem_util)
