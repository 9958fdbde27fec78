"""The metrics of DESIGN.md as pure functions over per-job records.

The simulator, `rltune eval`, telemetry and the tests all compute them here, and
a `--jobs-out` file read back (shared.sim.jobs_out) gives the same records, so
every summary figure is recomputable from that file (plus the cluster's GPU
count for `gpu_util`, and the solver timings for `placement_*`).

Definitions (over the jobs that finished, i.e. have at least one run segment):

* `jobs`: how many finished; JCT = last finish - submit; queue = first start - submit;
* `avg_bsld`: mean of max(1, JCT / max(run, 10 s)), run = total time holding GPUs;
* `gpu_util`: sum over segments of (GPUs held x time inside [first submit, last
  submit]) / (total GPUs x (last submit - first submit)): how busy the cluster was
  while the trace was still sending work; a share of g milli-GPUs counts as g / 1000
  of a GPU (0 when the span is empty: a single submit instant);
* `gpu_util_makespan`: the same over [first submit, last finish] (the makespan);
* `max_queue_s`, `queue_by_size`: the longest queueing delay, and avg / max / count
  per job-size bucket of GPUs requested (`1`, `2-7`, `8-15`, `16+`);
* `makespan_s`: last finish - first submit (first submit over every job in the run);
* percentiles are linear interpolation between closest ranks (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "SUMMARY_KEYS",
    "JobRecord",
    "Segment",
    "jct_cdf",
    "percentile",
    "queue_by_size",
    "queue_delay_series",
    "size_bucket",
    "summarize",
    "utilisation_series",
]

SUMMARY_KEYS = (
    "jobs",
    "avg_jct_s",
    "p50_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "p99_queue_s",
    "avg_bsld",
    "gpu_util",
    "gpu_util_makespan",
    "max_queue_s",
    "queue_by_size",
    "priority_inversions",
    "discipline",
    "makespan_s",
    "placement_p50_ms",
    "placement_p99_ms",
    "rejected",
)


@dataclass(frozen=True, slots=True)
class Segment:
    """One stretch of time a job held GPUs."""

    start_s: float
    finish_s: float
    gpu_type: str = ""  # the type(s) it ran on, `+`-joined
    nodes: str = ""  # `node:idx+idx;node:idx`
    offload_s: float = 0.0  # run time added by migrations compute did not hide (offloading jobs)
    restart_s: float = 0.0  # first seconds of the segment spent restoring a moved job's checkpoint
    lost_s: float = 0.0  # last seconds of a preempted segment, lost (after its last checkpoint)


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    vc: str
    submit_s: float
    num_gpus: int
    gpu_milli: int = 1000
    segments: tuple[Segment, ...] = ()  # empty: never ran (rejected)
    param_bytes: int = 0  # > 0: the job trains with offloading (10Cache) of this model size
    timed_out: bool = False  # stopped when it had run its time_limit_s, its work not done

    @property
    def finished(self) -> bool:
        return bool(self.segments)

    @property
    def jct_s(self) -> float:
        return self.segments[-1].finish_s - self.submit_s

    @property
    def queue_s(self) -> float:
        return self.segments[0].start_s - self.submit_s

    @property
    def run_s(self) -> float:
        return sum(s.finish_s - s.start_s for s in self.segments)

    @property
    def gpus(self) -> float:
        return self.num_gpus * self.gpu_milli / 1000.0

    @property
    def bsld(self) -> float:
        return max(1.0, self.jct_s / max(self.run_s, 10.0))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, interpolating linearly; NaN if empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(
    records: Iterable[JobRecord],
    total_gpus: int,
    placement_ms: Sequence[float] = (),
    rejected: Mapping[str, int] | None = None,
    discipline: str = "",
    priority_inversions: int = 0,
) -> dict[str, object]:
    """The summary JSON of DESIGN.md, keys in `SUMMARY_KEYS` order, then `timed_out` (the
    jobs stopped at their time limit) where any was. `discipline` and
    `priority_inversions` are the run's, passed through (a jobs file cannot show them)."""
    recs = list(records)
    done = [r for r in recs if r.finished]
    jct = [r.jct_s for r in done]
    queue = [r.queue_s for r in done]
    n = len(done)
    first = min((r.submit_s for r in recs), default=0.0)
    last = max((r.segments[-1].finish_s for r in done), default=first)
    last_submit = max((r.submit_s for r in recs), default=first)
    makespan = last - first
    held = sum(r.gpus * r.run_s for r in done)
    span = last_submit - first
    in_span = sum(
        r.gpus * max(0.0, min(s.finish_s, last_submit) - max(s.start_s, first))
        for r in done
        for s in r.segments
    )
    out: dict[str, object] = {
        "jobs": n,
        "avg_jct_s": _mean(jct),
        "p50_jct_s": percentile(jct, 50),
        "p99_jct_s": percentile(jct, 99),
        "avg_queue_s": _mean(queue),
        "p99_queue_s": percentile(queue, 99),
        "avg_bsld": _mean([r.bsld for r in done]),
        "gpu_util": in_span / (total_gpus * span) if total_gpus and span > 0 else 0.0,
        "gpu_util_makespan": held / (total_gpus * makespan) if total_gpus and makespan > 0 else 0.0,
        "max_queue_s": max(queue, default=math.nan),
        "queue_by_size": queue_by_size(done),
        "priority_inversions": priority_inversions,
        "discipline": discipline,
        "makespan_s": makespan,
        "placement_p50_ms": percentile(placement_ms, 50) if placement_ms else 0.0,
        "placement_p99_ms": percentile(placement_ms, 99) if placement_ms else 0.0,
        "rejected": dict(sorted((rejected or {}).items())),
    }
    timed_out = sum(r.timed_out for r in done)
    if timed_out:  # jobs stopped at their time limit: only where there were any
        out["timed_out"] = timed_out
    return out


SIZE_BUCKETS = (("1", 1, 1), ("2-7", 2, 7), ("8-15", 8, 15), ("16+", 16, 1 << 30))


def size_bucket(num_gpus: int) -> str:
    """The `queue_by_size` bucket of a job of `num_gpus` GPUs (a share counts as 1)."""
    for name, lo, hi in SIZE_BUCKETS:
        if lo <= num_gpus <= hi:
            return name
    return SIZE_BUCKETS[0][0]


def queue_by_size(done: Iterable[JobRecord]) -> dict[str, dict[str, float]]:
    """Queueing delay per size bucket: {"1": {"avg_s", "max_s", "jobs"}, ...}, every
    bucket present (avg/max NaN when it has no finished job)."""
    delays: dict[str, list[float]] = {name: [] for name, _, _ in SIZE_BUCKETS}
    for r in done:
        delays[size_bucket(r.num_gpus)].append(r.queue_s)
    return {
        name: {"avg_s": _mean(xs), "max_s": max(xs, default=math.nan), "jobs": len(xs)}
        for name, xs in delays.items()
    }


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan


def jct_cdf(records: Iterable[JobRecord]) -> tuple[list[float], list[float]]:
    """Sorted JCTs of finished jobs and their cumulative fractions, for a CDF plot."""
    xs = sorted(r.jct_s for r in records if r.finished)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def queue_delay_series(
    records: Iterable[JobRecord], bin_s: float
) -> tuple[list[float], list[float]]:
    """Mean queueing delay of the jobs submitted in each `bin_s` bin (bin start times)."""
    done = [r for r in records if r.finished]
    if not done:
        return [], []
    t0 = min(r.submit_s for r in done)
    sums: dict[int, list[float]] = {}
    for r in done:
        acc = sums.setdefault(int((r.submit_s - t0) // bin_s), [0.0, 0.0])
        acc[0] += r.queue_s
        acc[1] += 1
    keys = sorted(sums)
    return [t0 + k * bin_s for k in keys], [sums[k][0] / sums[k][1] for k in keys]


def utilisation_series(
    records: Iterable[JobRecord], total_gpus: int, bin_s: float
) -> tuple[list[float], list[float]]:
    """Share of the cluster's GPUs held, averaged over each `bin_s` bin (bin start times)."""
    recs = list(records)
    segs = [(s.start_s, s.finish_s, r.gpus) for r in recs for s in r.segments]
    if not segs or total_gpus <= 0:
        return [], []
    t0 = min(r.submit_s for r in recs)
    t1 = max(f for _, f, _ in segs)
    nbins = max(1, math.ceil((t1 - t0) / bin_s))
    held = [0.0] * nbins
    for start, finish, g in segs:
        b = int((start - t0) // bin_s)
        while b < nbins:
            lo, hi = t0 + b * bin_s, t0 + (b + 1) * bin_s
            overlap = min(hi, finish) - max(lo, start)
            if overlap <= 0 and finish <= lo:
                break
            held[b] += g * max(0.0, overlap)
            b += 1
    return [t0 + b * bin_s for b in range(nbins)], [h / (total_gpus * bin_s) for h in held]
