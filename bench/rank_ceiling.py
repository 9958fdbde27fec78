"""How much can a ranking that only knows a job's class buy? A ceiling for `rl`.

A policy that never sees run times can at best know, for each waiting job, what
its class's jobs take: the class being what the trace lets a scheduler tell jobs
apart by (Philly's derived trace names no user: the VC and the GPU count). This
runs, side by side on the same jobs and over the same orders of same-second
submissions as `bench.tie_orders`:

* `class-oracle`: shortest job first on the TRUE mean run time of the job's
  (VC, GPU count) class over the whole slice being simulated: more than any
  online estimate can know (it has seen the future of every class), less than
  `sjf-oracle` (each job's own run time);
* `drf+class-oracle`: `drf` across VCs, `class-oracle`'s order within a VC;
* `drf+burst-oracle`: as `drf+class-oracle`, with the true mean run time of the
  jobs of the same class submitted within 30 minutes of the job (a sweep's
  siblings: what a class's recent jobs could tell at best);
* `drf+siblings` (no oracle: what a policy could learn online): as
  `drf+burst-oracle`, from the siblings that have finished by the time of the
  round only, else the class's finished jobs;
* `drf+job-oracle`: `drf` across VCs, each job's own true run time within a VC
  (the most that ordering inside `drf`'s VC order can buy);
* and any named policy (`--policies`, default `drf,sjf-est,sjf-oracle`).

If `class-oracle` is not well ahead of `drf`, ranking by what the features can
tell apart (the learned policy's inputs are of that kind) has little to gain
over `drf` on this slice; `sjf-oracle` shows what a job's own run time buys.

    .venv/bin/python -m bench.rank_ceiling --seeds trace,1,2,3 \\
        [--cluster clusters/philly-hetero.yaml] [--since 2017-10-15] [--until T] \\
        [--load L] [--placer milp] [--policies drf,sjf-est,sjf-oracle] [--out F.png]

One JSON line per run on stdout; on stderr each policy's mean avg bounded slowdown
over the orders and the mean of its per-order ratios to `drf`; `--out` draws them.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import cast

import numpy as np

from bench.tie_orders import add_slice_args, shuffled, simulate_args
from rltune import simulate as cli
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.scoring.policies.base import GroupedPolicy, Key, StaticKeyPolicy
from services.scoring.policies.drf import DrfByAllocation
from shared.policy_api import Observation, Policy, QueuedJob
from shared.sim import simulate
from shared.traces import SkipStats, TraceJob

Class = tuple[str, int]  # (VC, GPU count)
BURST_S = 1800.0  # drf+burst-oracle: a job's siblings, same class, submitted within this


def class_means(jobs: Sequence[TraceJob]) -> dict[Class, float]:
    """The true mean run time of each (VC, GPU count) class over `jobs`."""
    total: dict[Class, float] = defaultdict(float)
    count: dict[Class, int] = defaultdict(int)
    for j in jobs:
        c = (j.vc, j.num_gpus)
        total[c] += j.duration_s or 0.0
        count[c] += 1
    return {c: total[c] / count[c] for c in total}


def burst_means(jobs: Sequence[TraceJob], window_s: float) -> dict[str, float]:
    """Per job, the true mean run time of the jobs of its (VC, GPU count) class
    submitted within `window_s` of it, itself included (a sweep's siblings)."""
    by_class: dict[Class, list[TraceJob]] = defaultdict(list)
    for j in jobs:
        by_class[(j.vc, j.num_gpus)].append(j)
    out: dict[str, float] = {}
    for members in by_class.values():
        members.sort(key=lambda j: j.submit_s)
        runs = np.cumsum([0.0] + [j.duration_s or 0.0 for j in members])
        submits = [j.submit_s for j in members]
        for j in members:
            lo = int(np.searchsorted(submits, j.submit_s - window_s, side="left"))
            hi = int(np.searchsorted(submits, j.submit_s + window_s, side="right"))
            out[j.job_id] = float(runs[hi] - runs[lo]) / (hi - lo)
    return out


class ClassOracle(StaticKeyPolicy):
    """SJF on the true mean run time of the job's class (an oracle at class level)."""

    name = "class-oracle"
    oracle = True

    def __init__(self, means: dict[Class, float]) -> None:
        self.means = means

    def key(self, job: QueuedJob) -> Key:
        return (self.means[(job.vc, job.num_gpus)], job.submit_s, job.seq)


class DrfClassOracle(GroupedPolicy):
    """`drf`'s VC shares first; among jobs of equal shares (within a VC, and across
    tied VCs), `ClassOracle`'s order (or, given `runs`, each job's own true run
    time: what ordering within `drf`'s shares can buy at most)."""

    name = "drf+class-oracle"
    oracle = True
    time_invariant = False

    def __init__(
        self,
        means: dict[Class, float],
        runs: dict[str, float] | None = None,
        name: str = "drf+class-oracle",
    ) -> None:
        self.means = means
        self.runs = runs
        self.name = name
        self._drf = DrfByAllocation()  # its shares; the class order breaks the ties
        self._shares: dict[str, float] = {}

    def reset(self, ctx: object) -> None:
        super().reset(ctx)  # type: ignore[arg-type]
        self._drf.reset(ctx)  # type: ignore[arg-type]

    def group_of(self, job: QueuedJob) -> Hashable:
        return job.vc

    def share(self, vc: str, obs: Observation) -> float:
        """`drf`'s rank of the VC this round (once per VC and `window` call)."""
        got = self._shares.get(vc)
        if got is None:
            got = self._shares[vc] = self._drf.group_rank(vc, obs)[0]
        return got

    def estimate(self, job: QueuedJob) -> float:
        run = self.runs[job.job_id] if self.runs is not None else None
        return run if run is not None else self.means[(job.vc, job.num_gpus)]

    def job_key(self, job: QueuedJob, obs: Observation) -> Key:
        return (self.share(job.vc, obs), self.estimate(job), job.submit_s, job.seq)

    def window(self, k: int, obs: Observation) -> list[QueuedJob]:  # type: ignore[override]
        # within a VC the class order is not FIFO, so the grouped merge does not
        # apply: the k smallest keys of the whole queue (an experiment, not a
        # served policy; `heapq.nsmallest` is `sorted(...)[:k]`, keys are unique)
        self._shares = {}  # a new round: the shares have moved
        waiting = [j for q in self._groups.values() for _, j in q.keyed()]
        return heapq.nsmallest(k, waiting, key=lambda j: self.job_key(j, obs))


class DrfSiblings(DrfClassOracle):
    """Not an oracle: what a policy could learn online. `drf`'s shares first; among
    equal shares, the mean run time of the job's *siblings that have finished by now*
    (same class, submitted within `BURST_S` of it), else of its class's finished
    jobs, else 0 (unknown: taken as short, as `sjf-est` does). A job's finish is known
    once its start plus its traced duration has passed (the duration on the reference
    type: a job on another type finishes a little earlier or later)."""

    name = "drf+siblings"
    oracle = False

    def __init__(self, runs: dict[str, float]) -> None:
        super().__init__({}, None, "drf+siblings")
        self.durations = runs
        self._now = 0.0
        self._ends: list[tuple[float, Class, float, float]] = []  # (end, class, submit, run)
        self._done: dict[Class, _Finished] = defaultdict(_Finished)

    def remove(self, job: QueuedJob) -> None:  # the job starts now (or left the queue)
        super().remove(job)
        run = self.durations.get(job.job_id, 0.0)
        heapq.heappush(self._ends, (self._now + run, (job.vc, job.num_gpus), job.submit_s, run))

    def window(self, k: int, obs: Observation) -> list[QueuedJob]:  # type: ignore[override]
        self._now = obs.now
        while self._ends and self._ends[0][0] <= obs.now:
            _, c, submit, run = heapq.heappop(self._ends)
            self._done[c].add(submit, run)
        return super().window(k, obs)

    def estimate(self, job: QueuedJob) -> float:
        done = self._done.get((job.vc, job.num_gpus))
        return done.mean_near(job.submit_s, BURST_S) if done is not None else 0.0


class _Finished:
    """The finished jobs of one class, by submit time: the mean run time of those
    submitted within `width` of a time, else of all, else 0 (`DrfSiblings`). Means
    are memoised until the next finish; a scan per waiting job and round made
    the loaded cluster's runs take hours."""

    def __init__(self) -> None:
        self.submits: list[float] = []
        self.runs: list[float] = []
        self._sums: list[float] | None = None  # prefix sums of `runs`, rebuilt on change
        self._memo: dict[tuple[float, float], float] = {}

    def add(self, submit: float, run: float) -> None:
        i = bisect.bisect_right(self.submits, submit)
        self.submits.insert(i, submit)
        self.runs.insert(i, run)
        self._sums = None
        self._memo.clear()

    def mean_near(self, t: float, width: float) -> float:
        got = self._memo.get((t, width))
        if got is not None:
            return got
        if self._sums is None:
            self._sums = [0.0, *itertools.accumulate(self.runs)]
        lo = bisect.bisect_left(self.submits, t - width)
        hi = bisect.bisect_right(self.submits, t + width)
        if hi == lo:  # no sibling near t: the class's mean
            lo, hi = 0, len(self.runs)
        got = (self._sums[hi] - self._sums[lo]) / (hi - lo) if hi > lo else 0.0
        self._memo[t, width] = got
        return got


def _policy(
    name: str, means: dict[Class, float], runs: dict[str, float], bursts: dict[str, float]
) -> Policy:
    if name == "class-oracle":
        return cast(Policy, ClassOracle(means))
    if name == "drf+class-oracle":
        return cast(Policy, DrfClassOracle(means))
    if name == "drf+job-oracle":
        return cast(Policy, DrfClassOracle(means, runs, name))
    if name == "drf+siblings":
        return cast(Policy, DrfSiblings(runs))
    if name == "drf+burst-oracle":
        return cast(Policy, DrfClassOracle(means, bursts, name))
    return make_policy(name)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rank_ceiling", description=__doc__)
    add_slice_args(p, "drf,sjf-est,sjf-oracle")
    p.add_argument("--out", default="", help="a PNG of the means and ratios")
    p.add_argument("--report", default="", help="no runs: summarise (and draw) these JSON lines")
    p.add_argument("--only", default="", help="run only these (comma-separated), no oracles")
    a = p.parse_args(argv)
    if a.report:
        return _report(a.report, a.out)
    args = simulate_args(a)
    names = ["class-oracle", "drf+class-oracle", "drf+burst-oracle", "drf+job-oracle"]
    names += a.policies.split(",")
    if a.only:
        names = a.only.split(",")
    if "drf" not in names:
        names.append("drf")
    cluster = cli.load_run_cluster(args)
    jobs = cli.load_run_jobs(args, cluster, SkipStats())
    means = class_means(jobs)
    runs = {j.job_id: j.duration_s or 0.0 for j in jobs}
    bursts = burst_means(jobs, BURST_S)
    bsld: dict[str, list[float]] = {n: [] for n in names}
    for seed in (-1 if s == "trace" else int(s) for s in a.seeds.split(",")):
        order = shuffled(jobs, seed)
        for name in names:
            with cli._LazyProgress(f"{name} seed {seed}") as bar:
                res = simulate(order, cluster, _policy(name, means, runs, bursts),
                               make_placer(args.placer, reproducible=True),
                               cli.sim_config(args), bar.tick)  # fmt: skip
            s = res.summary()
            row = {
                "seed": seed,
                "policy": name,
                "avg_bsld": s["avg_bsld"],
                "avg_jct_h": cast(float, s["avg_jct_s"]) / 3600,
                "gpu_util": s["gpu_util"],
            }
            print(json.dumps(row), flush=True)
            bsld[name].append(cast(float, s["avg_bsld"]))
    print(
        f"avg bsld over {len(bsld['drf'])} orders ({a.seeds}), {a.cluster} {a.placer}, "
        f"{a.since}..{a.until or 'end'}, load {a.load or 'as traced'}, "
        f"{len(means)} (VC, GPUs) classes:",
        file=sys.stderr,
    )
    _summary(bsld)
    if a.out:
        _plot(bsld, a.out, f"{a.cluster}, {a.since}..{a.until or 'end'}, {a.placer}")
    return 0


def _summary(bsld: dict[str, list[float]]) -> None:
    ref = np.asarray(bsld["drf"]) if "drf" in bsld else None
    for name, values in bsld.items():
        v = np.asarray(values)
        vs = f"  vs drf (mean of ratios) {np.mean(v / ref) - 1:+.1%}" if ref is not None else ""
        print(f"  {name:18s} mean {v.mean():.3f}  range {v.min():.3f}-{v.max():.3f}{vs}",
              file=sys.stderr)  # fmt: skip


def _report(path: str, out: str) -> int:
    bsld: dict[str, list[float]] = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            bsld.setdefault(row["policy"], []).append(float(row["avg_bsld"]))
    print(f"avg bsld from {path}:", file=sys.stderr)
    _summary(bsld)
    if out:
        _plot(bsld, out, path)
    return 0


def _plot(bsld: dict[str, list[float]], out: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(bsld)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, n in enumerate(names):
        v = bsld[n]
        ax.scatter([i] * len(v), v, color="tab:blue", s=14)
        ax.hlines(float(np.mean(v)), i - 0.3, i + 0.3, color="tab:red")
    bar = float(np.mean(bsld["drf"])) * 0.9
    ax.axhline(bar, ls="--", color="grey", lw=1)
    ax.text(len(names) - 0.5, bar, "10% below drf", va="bottom",
            ha="right", fontsize=8, color="grey")  # fmt: skip
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set_ylabel("avg bounded slowdown")
    ax.set_title(f"{title}\n(dots: each order of same-second submissions; red: their mean)",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
