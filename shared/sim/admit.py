"""Admission in the simulator: jobs that can never run are rejected on arrival,
with a reason (the keys of the summary's `rejected`)."""

from __future__ import annotations

from shared.cluster import ClusterSpec
from shared.policy_api import QueuedJob
from shared.sim.state import ClusterState
from shared.traces import TraceJob

__all__ = ["NO_SUCH_TYPE", "admit_reason"]

NO_SUCH_TYPE = "GPU type not in cluster"


def admit_reason(
    tj: TraceJob, job: QueuedJob, cluster: ClusterSpec, state: ClusterState
) -> str | None:
    """Why `job` can never run on `cluster` (None: it can)."""
    if tj.duration_s is None:
        return "no run time in trace"
    if job.num_gpus <= 0:
        return "no GPUs requested"
    types = job.gpu_types
    if types and not any(t in state.total_by_type for t in types):
        return NO_SUCH_TYPE
    if job.num_gpus > _capacity(types, state):
        return "more GPUs than the cluster has"
    if tj.priority_class and tj.priority_class not in cluster.priority_classes:
        return "unknown priority class"
    q = cluster.queues.get(cluster.queue_of(job.vc))
    if q is not None and q.limit_gpus is not None and job.gpus > q.limit_gpus:
        return "more GPUs than its queue's limit"
    return None


def _capacity(types: frozenset[str], state: ClusterState) -> int:
    if not types:
        return state.total
    return sum(state.total_by_type.get(t, 0) for t in types)
