"""Trace readers (DESIGN.md, "Cluster model and simulator"). One module per format.

Every reader streams `TraceJob`s in file order and counts what it skipped, by
reason, in a `SkipStats` it is handed. The simulator orders by submit time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shared.errors import UserError

__all__ = ["SkipStats", "TraceJob", "lacking_fields", "require_fields"]


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. `duration_s` is ground truth: only the simulator sees it."""

    job_id: str
    submit_s: float
    duration_s: float | None  # run time on the trace's reference GPU type; None if unknown
    num_gpus: int
    gpu_milli: int = 1000
    gpu_types: tuple[str, ...] = ()  # allowed GPU types, in the cluster's names; () = any
    user: str = ""
    vc: str = ""
    model: str = ""
    param_bytes: int | None = None  # offload model size, where the trace knows it
    weight: float = 1.0  # the job's priority weight (JobSpec.weight)
    project: str = ""  # group / account (JobSpec.project)
    app: str = ""  # executable or job name (JobSpec.app)
    time_limit_s: float | None = None  # requested wall time (JobSpec.time_limit_s); None: not given
    priority_class: str = ""  # JobSpec.priority_class: a name of the cluster's priority_classes


@dataclass
class SkipStats:
    """Rows a reader passed over, by reason (e.g. "zero GPUs", "unfinished", "bad row")."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # reason -> first offending row/line

    def skip(self, reason: str, example: str = "") -> None:
        self.counts[reason] += 1
        self.examples.setdefault(reason, example[:200])

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def lacking_fields(needs: Iterable[str], jobs: Sequence[TraceJob]) -> list[str]:
    """The TraceJob fields of `needs` (a policy's `needs`) that no job of `jobs` carries."""
    return [f for f in needs if not any(getattr(j, f) for j in jobs)]


def require_fields(label: str, needs: Iterable[str], jobs: Sequence[TraceJob], trace: str) -> None:
    """UserError (one line) if no job of `jobs` carries one of the TraceJob fields a
    policy `needs` (e.g. `sjf-req` reads `time_limit_s`, which Philly has none of)."""
    lacking = lacking_fields(needs, jobs)
    if lacking:
        raise UserError(
            f"policy {label} needs {' and '.join(lacking)}, which no job of {trace} "
            f"carries; choose another policy or a trace that has it"
        )
