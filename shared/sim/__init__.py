"""The discrete-event simulator (DESIGN.md, "Cluster model and simulator").

`load_jobs` reads a trace (the first N by submit time), `simulate` runs it on a
cluster with a policy and a placer, `write_jobs_csv` writes `--jobs-out`.
"""

from __future__ import annotations

from shared.sim.engine import SimConfig, SimResult, Simulator, simulate
from shared.sim.jobs_in import load_jobs
from shared.sim.jobs_out import read_jobs_csv, write_jobs_csv

__all__ = [
    "SimConfig",
    "SimResult",
    "Simulator",
    "load_jobs",
    "read_jobs_csv",
    "simulate",
    "write_jobs_csv",
]
