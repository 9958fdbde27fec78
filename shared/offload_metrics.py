"""Offload figures over per-job records (DESIGN.md, "10Cache"), recomputable from
`--jobs-out` (its `param_bytes`, `offload_s` and `restart_s` columns).

Over the offloading jobs (param_bytes > 0) that finished:

* `offload_jobs`: how many;
* `offload_avg_jct_s`: their mean JCT (finish − submit);
* `offload_migration_s`: mean over them of Σ offload_s (run time added by
  migrations that compute did not hide);
* `offload_restart_s`: mean over them of Σ restart_s (time spent restoring
  checkpoints after re-placements: services/placement/replace.py);
* `offload_moves`: how many re-placements they made (segments with restart_s > 0);
* `offload_slowdown`: (Σ offload_s + Σ restart_s) / Σ (run − offload_s −
  restart_s): how much longer, as a fraction, migrations (and the restarts of
  jobs moved to cut them) made their GPU time than it would have been without.
  Without re-placements restart_s is 0 and this is Σ offload_s / Σ (run − offload_s).
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.metrics import JobRecord

__all__ = ["OFFLOAD_KEYS", "offload_summary"]

OFFLOAD_KEYS = (
    "offload_jobs",
    "offload_avg_jct_s",
    "offload_migration_s",
    "offload_restart_s",
    "offload_moves",
    "offload_slowdown",
)


def offload_summary(records: Iterable[JobRecord]) -> dict[str, float]:
    jobs = [r for r in records if r.param_bytes > 0 and r.finished]
    if not jobs:
        return {"offload_jobs": 0}
    added = [sum(s.offload_s for s in r.segments) for r in jobs]
    restart = [sum(s.restart_s for s in r.segments) for r in jobs]
    lost = sum(added) + sum(restart)
    base = sum(r.run_s for r in jobs) - lost
    return {
        "offload_jobs": len(jobs),
        "offload_avg_jct_s": sum(r.jct_s for r in jobs) / len(jobs),
        "offload_migration_s": sum(added) / len(jobs),
        "offload_restart_s": sum(restart) / len(jobs),
        "offload_moves": sum(1 for r in jobs for s in r.segments if s.restart_s > 0),
        "offload_slowdown": lost / base if base > 0 else 0.0,
    }
