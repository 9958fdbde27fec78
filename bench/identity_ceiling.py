"""What run-time knowledge buys on the traces that name who submitted what: a ceiling
for a policy that learns from identity (`rltune bench identity_ceiling`).

On each cell of a matrix file (`rltune eval --matrix`'s format) whose trace names
users, beside every non-clairvoyant heuristic, it runs:

* `f1-oracle` and `sjf-oracle`: each job's own true run time in `f1`'s rule and in
  shortest-first;
* `f1-noise:S`: `f1`'s rule on the true run time times 10^(S z), z standard normal,
  drawn per job from its seq (errors that know nothing of the job but its run time);
* `f1-class:K` and `sjf-class:K`: the TRUE mean run time of the job's class over the
  whole cell, the future included (more than any history can know), K naming the
  fields that make a class (`user`, `user+req`, `user+app+req+gpus`).

All of them are oracles (they read the simulator's run times) and are labelled so.
If the class oracles stay near the best heuristic while the per-job ones are far
below it, what the per-job oracles buy is the order among jobs that identity
cannot tell apart, which no model of who submitted what can learn
(docs/results/policy-matrix.md, "Where the oracle's gain comes from").

    rltune bench identity_ceiling [--matrix bench/matrices/validation.yaml]
        [--sigmas 0.25,0.5,1,1.5] [--classes user,user+req,user+app+req+gpus]
        [--out DIR]

Prints, per cell and policy, avg bounded slowdown over the cell's best heuristic,
and each policy's geometric mean over the cells; `--out` writes `ceiling.json` and
`ceiling.png` (the geometric means, one bar per policy).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rltune.matrix import HEURISTICS, Cell, _cell_jobs, geomean, load_matrix
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.scoring.policies.base import Key, OracleKeyPolicy
from shared.errors import UserError
from shared.jsonfile import write_json
from shared.policy_api import Policy, PolicyContext, QueuedJob
from shared.sim import SimConfig, simulate
from shared.traces import TraceJob, lacking_fields

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "bench" / "matrices" / "validation.yaml"
F1_SUBMIT_WEIGHT = 870.0  # services/scoring/policies/f1.py

# the fields that make a job's class, by name
CLASSES: dict[str, Callable[[QueuedJob | TraceJob], Hashable]] = {
    "user": lambda j: (j.user,),
    "user+req": lambda j: (j.user, j.time_limit_s),
    "user+app+req+gpus": lambda j: (j.user, j.app, j.time_limit_s, j.num_gpus),
    "job": lambda j: (j.job_id,),  # each job its own class: the per-job oracle (tests)
}


def f1_key(r: float, num_gpus: int, s: float) -> float:
    """f1's score, log10(r) n + 870 log10(s) (services/scoring/policies/f1.py)."""
    return math.log10(max(r, 1.0)) * num_gpus + F1_SUBMIT_WEIGHT * math.log10(max(s, 1.0))


class _F1Rule(OracleKeyPolicy):
    """`f1`'s rule on `run_time(job)`; s from the first submit seen, as `f1`'s."""

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._t0: float | None = None

    def run_time(self, job: QueuedJob) -> float:
        raise NotImplementedError

    def key(self, job: QueuedJob) -> Key:
        if self._t0 is None:
            self._t0 = job.submit_s
        s = job.submit_s - self._t0 + 1.0
        return (f1_key(self.run_time(job), job.num_gpus, s), job.submit_s, job.seq)


class F1Noise(_F1Rule):
    """f1 on the true run time x 10^(sigma z), z ~ N(0, 1) drawn from the job's seq."""

    def __init__(self, sigma: float) -> None:
        self.sigma = sigma
        self.name = f"f1-noise:{sigma:g}"

    def run_time(self, job: QueuedJob) -> float:
        z = float(np.random.default_rng([job.seq, 7]).standard_normal())
        return self.run_s(job) * 10.0 ** (self.sigma * z)


class F1Class(_F1Rule):
    """f1 on the true mean run time of the job's class over the whole cell."""

    def __init__(self, kind: str, mean: dict[Hashable, float]) -> None:
        self.kind, self.mean = kind, mean
        self.name = f"f1-class:{kind}"

    def run_time(self, job: QueuedJob) -> float:
        return self.mean[CLASSES[self.kind](job)]


class SjfClass(OracleKeyPolicy):
    """Shortest first on the true mean run time of the job's class over the whole cell."""

    def __init__(self, kind: str, mean: dict[Hashable, float]) -> None:
        self.kind, self.mean = kind, mean
        self.name = f"sjf-class:{kind}"

    def key(self, job: QueuedJob) -> Key:
        return (self.mean[CLASSES[self.kind](job)], job.submit_s, job.seq)


def class_means(jobs: Sequence[TraceJob], kind: str) -> dict[Hashable, float]:
    """The mean true run time (reference type) of each class of `jobs`."""
    total: dict[Hashable, list[float]] = {}
    for j in jobs:
        acc = total.setdefault(CLASSES[kind](j), [0.0, 0.0])
        acc[0] += j.duration_s or 0.0
        acc[1] += 1.0
    return {k: s / n for k, (s, n) in total.items()}


def oracles(
    jobs: Sequence[TraceJob], sigmas: Sequence[float], kinds: Sequence[str]
) -> list[Policy]:
    out: list[Policy] = [make_policy("f1-oracle"), make_policy("sjf-oracle")]
    out += [F1Noise(s) for s in sigmas]
    for kind in kinds:
        mean = class_means(jobs, kind)
        out += [F1Class(kind, mean), SjfClass(kind, mean)]
    return out


def run_cell(
    cell: Cell, sigmas: Sequence[float], kinds: Sequence[str], placer: str = "milp"
) -> dict[str, float] | None:
    """Each policy's avg bounded slowdown over the cell's best heuristic; None if the
    cell's trace names no user."""
    cluster, jobs = _cell_jobs(cell)
    if not any(j.user for j in jobs):
        return None
    config = SimConfig(seed=0, discipline="easy")
    bsld: dict[str, float] = {}
    for name in HEURISTICS:
        policy = make_policy(name)
        if lacking_fields(getattr(policy, "needs", ()), jobs):
            continue
        res = simulate(jobs, cluster, policy, make_placer(placer, reproducible=True), config)
        bsld[name] = float(res.summary()["avg_bsld"])  # type: ignore[arg-type]
    best = min(bsld.values())
    out = {"best": best, **{f"heuristic:{k}": v / best for k, v in bsld.items()}}
    for policy in oracles(jobs, sigmas, kinds):
        res = simulate(jobs, cluster, policy, make_placer(placer, reproducible=True), config)
        out[policy.name] = float(res.summary()["avg_bsld"]) / best  # type: ignore[arg-type]
    return out


def _floats(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--sigmas {text!r}: give numbers, such as 0.25,0.5,1") from None
    if any(not (v >= 0 and math.isfinite(v)) for v in vals):
        raise UserError(f"--sigmas {text!r}: each must be 0 or more")
    return vals


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="rltune bench identity_ceiling", description=__doc__.splitlines()[0]
    )
    p.add_argument("--matrix", default=str(MATRIX))
    p.add_argument("--sigmas", default="0.25,0.5,1,1.5")
    p.add_argument("--classes", default="user,user+req,user+app+req+gpus")
    p.add_argument("--placer", default="milp")
    p.add_argument("--out", default=None, metavar="DIR")
    a = p.parse_args(argv)
    sigmas = _floats(a.sigmas)
    kinds = [k for k in a.classes.split(",") if k]
    unknown = [k for k in kinds if k not in CLASSES]
    if unknown:
        raise UserError(f"--classes: unknown {unknown[0]!r}; choose from {', '.join(CLASSES)}")
    rows: dict[str, dict[str, float]] = {}
    for cell in load_matrix(a.matrix):
        got = run_cell(cell, sigmas, kinds, a.placer)
        if got is None:
            print(f"{cell.name}: no user names in its trace, skipped", file=sys.stderr)
            continue
        rows[cell.name] = got
        print(f"{cell.name}: done", file=sys.stderr, flush=True)
    if not rows:
        raise UserError(f"{a.matrix}: no cell's trace names users")
    names = [k for k in next(iter(rows.values())) if k != "best"]
    geo = {n: geomean([r[n] for r in rows.values() if n in r]) for n in names}
    print("| policy | " + " | ".join(rows) + " | geometric mean |")
    print("|---|" + "---:|" * (len(rows) + 1))
    for n in names:
        cells = " | ".join(f"{r[n]:.3f}" if n in r else "n/a" for r in rows.values())
        print(f"| {n} | {cells} | {geo[n]:.3f} |")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json({"matrix": a.matrix, "cells": rows, "geomean": geo}, str(out / "ceiling.json"))
        _plot(geo, out / "ceiling.png")
    return 0


def _plot(geo: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(geo)
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(names) + 1.5))
    ax.barh(names, [geo[n] for n in names], color="tab:blue")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(0.9, color="tab:red", lw=0.8, ls="--", label="the 0.90 target")
    ax.invert_yaxis()
    ax.set_xlabel("geometric mean of avg bounded slowdown / the cell's best heuristic")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
