"""Independent feasibility check of a placement (used by the tests and the benches).

Written from the interface's rules alone, sharing no code with any placer:
every allocation names a job of the window once, only existing nodes and GPU
indices, only allowed GPU types, all of the job's GPUs (gang), the job's own
share, distinct GPUs within the job, a share only for single-GPU jobs, and no
GPU given more than its free milli.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree

__all__ = ["violations"]


def violations(
    jobs: Sequence[JobRequest], nodes: Sequence[NodeFree], allocs: Sequence[Allocation]
) -> list[str]:
    """Every rule the placement breaks, as readable strings; [] when feasible."""
    job_by_id = {j.job_id: j for j in jobs}
    node_by_id = {n.node_id: n for n in nodes}
    used: dict[tuple[str, int], int] = {}  # (node, GPU index) -> milli given out
    seen: set[str] = set()
    out: list[str] = []
    for a in allocs:
        job = job_by_id.get(a.job_id)
        if job is None:
            out.append(f"{a.job_id}: not in the window")
            continue
        if a.job_id in seen:
            out.append(f"{a.job_id}: placed twice")
        seen.add(a.job_id)
        if a.gpu_milli != job.gpu_milli:
            out.append(f"{a.job_id}: share {a.gpu_milli} != requested {job.gpu_milli}")
        if job.gpu_milli < FULL_GPU and job.num_gpus != 1:
            out.append(f"{a.job_id}: a share for a multi-GPU job")
        gpus: list[tuple[str, int]] = [(n, g) for n, idx in a.gpus for g in idx]
        if len(gpus) != job.num_gpus:
            out.append(f"{a.job_id}: {len(gpus)} GPUs given, {job.num_gpus} requested (gang)")
        if len(set(gpus)) != len(gpus):
            out.append(f"{a.job_id}: a GPU given twice to the job")
        for node_id, g in gpus:
            node = node_by_id.get(node_id)
            if node is None or not 0 <= g < len(node.free_milli):
                out.append(f"{a.job_id}: no GPU {node_id}:{g}")
                continue
            if job.gpu_types and node.gpu_type not in job.gpu_types:
                out.append(f"{a.job_id}: type {node.gpu_type} not allowed")
            used[(node_id, g)] = used.get((node_id, g), 0) + job.gpu_milli
    for (node_id, g), milli in used.items():
        free = node_by_id[node_id].free_milli[g]
        if milli > free:
            out.append(f"GPU {node_id}:{g}: {milli} milli given, {free} free")
    return out
