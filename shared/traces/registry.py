"""Trace formats by `--format` name, and `open_trace`, the one way the simulator,
evaluation and training read a trace.

A reader is `(path, stats) -> Iterator[TraceJob]`, streaming in file order and
counting skipped rows in `stats`. `open_trace` adds the mapping of the trace's
GPU type names onto the cluster's (shared.gpu_names).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path

from shared.cluster import ClusterSpec
from shared.errors import UserError
from shared.gpu_names import TypeMapper
from shared.traces import SkipStats, TraceJob

__all__ = ["FORMATS", "Reader", "open_trace", "reader_for"]

Reader = Callable[[str | Path, SkipStats], Iterator[TraceJob]]

# format name -> (module under shared.traces, function); imported on first use
FORMATS: dict[str, tuple[str, str]] = {
    "philly": ("philly", "read_philly"),
    "helios": ("helios", "read_helios"),
    "alibaba2020": ("alibaba2020", "read_alibaba2020"),
    "alibaba2023": ("alibaba2023", "read_alibaba2023"),
    "rltune": ("rltune", "read_rltune"),
    "jsonl": ("jsonl", "read_jsonl"),
    "swf": ("swf", "read_swf"),
    "alcf": ("alcf", "read_alcf"),
    "itp": ("itp", "read_itp"),
}


def reader_for(fmt: str) -> Reader:
    """The reader function of a format name; UserError naming the choices if unknown."""
    if fmt not in FORMATS:
        raise UserError(f"unknown trace format {fmt!r}; choose from {', '.join(FORMATS)}")
    module, func = FORMATS[fmt]
    mod = importlib.import_module(f"shared.traces.{module}")
    reader: Reader = getattr(mod, func)
    return reader


def open_trace(
    path: str | Path, fmt: str, cluster: ClusterSpec | None, stats: SkipStats
) -> Iterator[TraceJob]:
    """Stream a trace's jobs in file order, GPU type names mapped onto `cluster`'s."""
    reader = reader_for(fmt)
    if not Path(path).exists():
        raise UserError(f"trace file not found: {path}")
    jobs = reader(path, stats)
    if cluster is None:
        return jobs
    return _mapped(jobs, TypeMapper(cluster.gpu_types))


def _mapped(jobs: Iterator[TraceJob], mapper: TypeMapper) -> Iterator[TraceJob]:
    for job in jobs:
        if job.gpu_types:
            types = mapper.map_types(job.gpu_types)
            if types != job.gpu_types:
                job = dataclasses.replace(job, gpu_types=types)
        yield job
