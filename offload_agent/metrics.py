"""Prometheus metrics the host agent keeps from each `OffloadStats` it relays
(DESIGN.md naming: `rltune_` prefix, base units).

Per-job gauges (`job`, `node` labels) describe a running job and are removed when
it ends (`forget`), so series do not pile up with the jobs a node has seen. Bytes
moved are a counter per node: each job reports running totals, and the counter
adds what grew since its last report (a job's totals restart after warm-up: then
the new total is what grew)."""

from __future__ import annotations

import contextlib
import threading

from prometheus_client import Counter, Gauge

from shared.messages import OffloadStats

__all__ = ["forget", "observe"]

_LABELS = ["job", "node"]
HIT_RATIO = Gauge(
    "rltune_offload_hit_ratio", "Fast-tier hit rate of a job's tensor accesses", _LABELS
)
MIGRATION = Gauge(  # "quantile" is a summary's label; a gauge's is named otherwise
    "rltune_offload_migration_seconds",
    "Copy latency per migration, by percentile",
    [*_LABELS, "percentile"],
)
MOVED = Counter(
    "rltune_offload_moved_bytes",  # exported as rltune_offload_moved_bytes_total
    "Bytes moved into / out of the fast tier on this node",
    ["node", "direction"],
)
STEP = Gauge("rltune_offload_step_seconds", "Mean training step time under offload", _LABELS)
UTIL = Gauge("rltune_offload_memory_utilisation_ratio", "Buffer bytes / budget", [*_LABELS, "tier"])

_last: dict[tuple[str, str], tuple[int, int]] = {}  # (job, node) -> last (bytes_in, bytes_out)
_lock = threading.Lock()


def observe(st: OffloadStats) -> None:
    labels = (st.job_id, st.node_id)
    HIT_RATIO.labels(*labels).set(st.hit_rate)
    MIGRATION.labels(*labels, "50").set(st.migration_ms_p50 / 1e3)
    MIGRATION.labels(*labels, "99").set(st.migration_ms_p99 / 1e3)
    STEP.labels(*labels).set(st.step_ms / 1e3)
    UTIL.labels(*labels, "gpu").set(st.gpu_mem_util)
    UTIL.labels(*labels, "host").set(st.host_mem_util)
    with _lock:
        last_in, last_out = _last.get(labels, (0, 0))
        _last[labels] = (st.bytes_in, st.bytes_out)
    MOVED.labels(st.node_id, "in").inc(_grown(st.bytes_in, last_in))
    MOVED.labels(st.node_id, "out").inc(_grown(st.bytes_out, last_out))


def _grown(total: int, last: int) -> int:
    return total - last if total >= last else max(total, 0)


def forget(job_id: str, node_id: str) -> None:
    """Remove a finished job's series."""
    labels = (job_id, node_id)
    with _lock:
        _last.pop(labels, None)
    for gauge, extra in (
        (HIT_RATIO, [()]),
        (MIGRATION, [("50",), ("99",)]),
        (STEP, [()]),
        (UTIL, [("gpu",), ("host",)]),
    ):
        for more in extra:
            with contextlib.suppress(KeyError):  # never observed
                gauge.remove(*labels, *more)
