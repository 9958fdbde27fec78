"""Reader for the Alibaba 2023 GPU trace's pod list (`--format alibaba2023`).

The files are `openb_pod_list_*.csv` of alibaba/clusterdata `cluster-trace-gpu-v2023`:

    name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
    creation_time,deletion_time,scheduled_time

* `num_gpu` GPUs of `gpu_milli` milli-GPU each; `gpu_milli` < 1000 is a
  GPU-sharing pod (always single-GPU in the published lists);
* `gpu_spec` lists the allowed GPU models separated by `|` (empty: any); the
  models are the node list's own names (P100, T4, V100M16, V100M32, A10, G2,
  G3), so they are kept as is unless a `type_map` renames them;
* submit = `creation_time`; duration = `deletion_time - scheduled_time` where
  both are known (seconds), else None (Pending pods never started). Pods still
  Running at the end of collection get the time they were observed to run;
* the packing list `openb_pod_list_multigpu20.csv` has no time columns: its
  pods all arrive at 0 with unknown duration.

Skipped and counted in `SkipStats`: CPU-only pods ("zero GPUs"), rows whose
numbers do not parse or are out of range ("bad row").
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping
from pathlib import Path

from shared.errors import UserError
from shared.placement_api import FULL_GPU
from shared.traces import SkipStats, TraceJob

__all__ = ["read_alibaba2023"]

_REQUIRED = ("name", "num_gpu")


def read_alibaba2023(
    path: str | Path,
    stats: SkipStats,
    type_map: Mapping[str, str] | None = None,
) -> Iterator[TraceJob]:
    """Stream the GPU pods of an openb pod list in file order.

    `type_map` renames trace GPU models to the cluster's names (identity where absent).
    """
    p = Path(path)
    try:
        fh = p.open(newline="")
    except OSError as exc:
        raise UserError(f"cannot read trace {p}: {exc}") from exc
    with fh:
        rows = csv.DictReader(fh)
        fields = rows.fieldnames or []
        missing = [c for c in _REQUIRED if c not in fields]
        if missing:
            raise UserError(f"{p}: not an openb pod list (missing columns {missing})")
        for row in rows:
            job = _job_of(row, stats, type_map or {})
            if job is not None:
                yield job


def _job_of(row: dict[str, str], stats: SkipStats, type_map: Mapping[str, str]) -> TraceJob | None:
    """One pod as a TraceJob, or None (counted in `stats`) if it is skipped."""
    example = ",".join(v or "" for v in row.values())
    try:
        num_gpus = int(row["num_gpu"] or 0)
        milli = int(row.get("gpu_milli") or FULL_GPU)
        submit = float(row.get("creation_time") or 0)
        duration = _duration(row.get("scheduled_time"), row.get("deletion_time"))
    except (TypeError, ValueError):
        stats.skip("bad row", example)
        return None
    if num_gpus == 0:
        stats.skip("zero GPUs", example)
        return None
    if num_gpus < 0 or not 0 < milli <= FULL_GPU or (milli < FULL_GPU and num_gpus != 1):
        stats.skip("bad row", example)
        return None
    return TraceJob(
        job_id=row["name"],
        submit_s=submit,
        duration_s=duration,
        num_gpus=num_gpus,
        gpu_milli=milli,
        gpu_types=_types(row.get("gpu_spec") or "", type_map),
    )


def _duration(scheduled: str | None, deleted: str | None) -> float | None:
    """Seconds the pod ran, or None if it never started or the columns are absent."""
    if not scheduled or not deleted:
        return None
    d = float(deleted) - float(scheduled)
    if d < 0:
        raise ValueError("deletion before scheduling")
    return d


def _types(spec: str, type_map: Mapping[str, str]) -> tuple[str, ...]:
    """`V100M16|V100M32|V100M32` -> ('V100M16', 'V100M32'): deduplicated, sorted, renamed."""
    names = {type_map.get(t.strip(), t.strip()) for t in spec.split("|") if t.strip()}
    return tuple(sorted(names))
