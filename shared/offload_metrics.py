"""Offload figures over per-job records (DESIGN.md, "10Cache"), recomputable from
`--jobs-out` (its `param_bytes` and `offload_s` columns).

Over the offloading jobs (param_bytes > 0) that finished:

* `offload_jobs`: how many;
* `offload_avg_jct_s`: their mean JCT (finish − submit);
* `offload_migration_s`: mean over them of Σ offload_s (run time added by
  migrations that compute did not hide);
* `offload_slowdown`: Σ offload_s / Σ (run − offload_s): how much longer, as a
  fraction, migrations made their GPU time than it would have been without.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.metrics import JobRecord

__all__ = ["OFFLOAD_KEYS", "offload_summary"]

OFFLOAD_KEYS = ("offload_jobs", "offload_avg_jct_s", "offload_migration_s", "offload_slowdown")


def offload_summary(records: Iterable[JobRecord]) -> dict[str, float]:
    jobs = [r for r in records if r.param_bytes > 0 and r.finished]
    if not jobs:
        return {"offload_jobs": 0}
    added = [sum(s.offload_s for s in r.segments) for r in jobs]
    base = sum(r.run_s for r in jobs) - sum(added)
    return {
        "offload_jobs": len(jobs),
        "offload_avg_jct_s": sum(r.jct_s for r in jobs) / len(jobs),
        "offload_migration_s": sum(added) / len(jobs),
        "offload_slowdown": sum(added) / base if base > 0 else 0.0,
    }
