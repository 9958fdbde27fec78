"""A trace's jobs as the simulator takes them: in submit order, the first N if asked."""

from __future__ import annotations

import heapq
from pathlib import Path

from shared.cluster import ClusterSpec
from shared.errors import UserError
from shared.traces import SkipStats, TraceJob
from shared.traces.registry import open_trace

__all__ = ["load_jobs"]


def load_jobs(
    path: str | Path, fmt: str, cluster: ClusterSpec, stats: SkipStats, limit: int | None = None
) -> list[TraceJob]:
    """The trace's jobs in submit order (file order on ties); the first `limit` if given."""
    if limit is not None and limit <= 0:
        raise UserError(f"--limit must be a positive number of jobs, got {limit}")
    stream = enumerate(open_trace(path, fmt, cluster, stats))
    if limit is None:
        pairs = sorted(stream, key=lambda p: (p[1].submit_s, p[0]))
    else:
        pairs = heapq.nsmallest(limit, stream, key=lambda p: (p[1].submit_s, p[0]))
    if not pairs:
        why = ", ".join(f"{n} {r}" for r, n in stats.counts.most_common()) or "the file is empty"
        raise UserError(f"{path}: no usable job in the trace ({why})")
    return [job for _, job in pairs]
