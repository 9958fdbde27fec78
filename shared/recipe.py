"""A run's recipe: which trace, selected and replayed how, on which cluster, under which
placer, discipline and seed; and what the simulator is given for it.

`rltune simulate`, `eval`, `whatif`, the benchmarks built on them and the cluster-sim
service describe a run with the same fields. The command line parses its flags into a
`RunRecipe` (argparse stays there); everything here is plain data and functions, so a
service or a benchmark builds the same simulator inputs without the command line.
What a run says about itself (a note on the cluster's reference, how arrivals were
compressed) goes to `say`, stderr unless the caller passes another.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.cluster import ClusterSpec, load_cluster
from shared.errors import UserError
from shared.speeds import DEFAULT_SPEEDS, speed_of
from shared.traces import SkipStats, TraceJob

if TYPE_CHECKING:
    from shared.sim import SimConfig

__all__ = [
    "RunJobs",
    "RunRecipe",
    "SimInputs",
    "build_inputs",
    "check_round_interval",
    "load_run_cluster",
    "load_run_jobs",
    "mark_offload",
]

Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True)
class RunRecipe:
    """What a simulated run's figures depend on besides the policy's own code."""

    trace: str
    """trace file"""
    format: str
    """its format: philly, helios, alibaba2020, alibaba2023, rltune, jsonl, swf, alcf, itp"""
    cluster: str
    """cluster YAML or openb node list CSV"""
    policy: str | None = None
    """the policy's name where a run has one (None: a command that runs several)"""
    reference: str | None = None
    """GPU type the trace's durations were measured on (None: the cluster's)"""
    seed: int = 0
    """seed of every random choice"""
    limit: int | None = None
    """only the first N jobs by submit time"""
    since: str = ""
    """only jobs submitted at or after this time (UTC date or trace seconds; "": all)"""
    until: str = ""
    """only jobs submitted before this time (as `since`)"""
    load: float | None = None
    """compress the submission gaps to this load (None: as recorded)"""
    load_basis: str = "offered"
    """what `load` is a value of: offered or span"""
    repeat: int = 1
    """the selected jobs replayed this many times back to back"""
    placer: str = "milp"
    """placer name (services/placement/registry.py)"""
    window: int = 128
    """jobs the policy hands placement per round"""
    preempt: bool = False
    """let a preemptive policy preempt"""
    discipline: str = "easy"
    """strict, best-effort or easy"""
    round_interval_s: float = 0.0
    """rounds at most every this many seconds of trace time (0: at every event)"""
    offload_fraction: float = 0.0
    """seeded fraction of the jobs marked as training with offload"""
    share_fraction: float = 0.0
    """seeded fraction of the whole one-GPU jobs made GPU shares"""

    def sim_config(self) -> SimConfig:
        """The simulator's settings; the recipe's own values checked first (one line)."""
        from shared.sim import SimConfig
        from shared.sim.share_jobs import check_fraction

        if self.window <= 0:
            raise UserError(f"--window must be positive, got {self.window}")
        check_fraction(self.share_fraction)
        return SimConfig(
            window=self.window,
            seed=self.seed,
            preempt=self.preempt,
            discipline=self.discipline,
            round_interval_s=check_round_interval(self.round_interval_s),
        )

    def settings(self, load_factor: float | None = None) -> dict[str, Any]:
        """The summary JSON's `settings` (the policy aside): the trace and its selection,
        the cluster, placement, discipline, and how arrivals were replayed and
        compressed (`load_factor`: gaps divided by it)."""
        return {
            "trace": self.trace,
            "format": self.format,
            "cluster": self.cluster,
            "reference": self.reference,
            "since": self.since or None,
            "until": self.until or None,
            "limit": self.limit,
            "repeat": self.repeat,
            "load": self.load,
            "load_basis": self.load_basis if self.load is not None else None,
            "load_factor": load_factor,
            "placer": self.placer,
            "discipline": self.discipline,
            "window": self.window,
            "round_interval_s": self.round_interval_s,
            "preempt": self.preempt,
            "offload_fraction": self.offload_fraction,
            "share_fraction": self.share_fraction,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class RunJobs:
    """The jobs a recipe selects, and the factor their gaps were divided by (`load`)."""

    jobs: list[TraceJob]
    load_factor: float | None = None


@dataclass(frozen=True)
class SimInputs:
    """Everything `shared.sim.simulate` takes besides the policy and the placer."""

    cluster: ClusterSpec
    jobs: list[TraceJob]
    config: SimConfig
    load_factor: float | None = None


def check_round_interval(seconds: float) -> float:
    """A round interval, checked: 0 or more seconds."""
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise UserError(f"--round-interval must be 0 or more seconds, got {seconds:g}")
    return seconds


def build_inputs(recipe: RunRecipe, stats: SkipStats, say: Say = _stderr) -> SimInputs:
    """The simulator's inputs for `recipe`: settings checked, cluster read, jobs selected,
    replayed, compressed and marked as offloading as the recipe says."""
    config = recipe.sim_config()
    cluster = load_run_cluster(recipe, say)
    loaded = load_run_jobs(recipe, cluster, stats, say)
    jobs = mark_offload(recipe, loaded.jobs, say)
    return SimInputs(cluster, jobs, config, loaded.load_factor)


def load_run_cluster(recipe: RunRecipe, say: Say = _stderr) -> ClusterSpec:
    """The recipe's cluster, with its `reference` applied if given. A cluster of GPU types
    of different speeds that names no reference (an openb node list names none) runs
    the trace's durations as measured on a speed-1.0 GPU (a P100): said once. No
    cluster ("") is an SWF log's own, from its header (`shared.traces.swf`)."""
    if not recipe.cluster:
        if recipe.format != "swf":
            raise UserError("--cluster is required (only --format swf has a default)")
        from shared.traces.swf import swf_cluster

        cluster = swf_cluster(recipe.trace)
    else:
        cluster = load_cluster(recipe.cluster)
    if recipe.reference is None:
        speeds = {speed_of(t, cluster.speed) for t in cluster.gpu_types}
        if cluster.reference is None and len(speeds) > 1:
            say(
                f"note: {recipe.cluster} names no reference GPU type: the trace's durations "
                "are taken as measured on a GPU of speed 1.0 (a P100); --reference TYPE "
                "says otherwise"
            )
        return cluster
    if recipe.reference not in cluster.speed and recipe.reference not in DEFAULT_SPEEDS:
        raise UserError(f"--reference {recipe.reference!r}: no speed known for that GPU type")
    return dataclasses.replace(cluster, reference=recipe.reference)


def load_run_jobs(
    recipe: RunRecipe, cluster: ClusterSpec, stats: SkipStats, say: Say = _stderr
) -> RunJobs:
    """The trace's jobs submitted in [since, until), the first `limit` of them, made
    shares, replayed and compressed as the recipe says."""
    from shared.sim.jobs_in import load_jobs
    from shared.traces._io import parse_time

    bounds = []
    for flag, text in (("--since", recipe.since), ("--until", recipe.until)):
        try:
            bounds.append(parse_time(text) if text else None)
        except ValueError:
            raise UserError(
                f"{flag} {text!r}: give YYYY-MM-DD[ HH:MM:SS] (UTC) or seconds"
            ) from None
    since, until = bounds
    if since is None and until is None:
        jobs = load_jobs(recipe.trace, recipe.format, cluster, stats, recipe.limit)
    else:
        jobs = [
            j
            for j in load_jobs(recipe.trace, recipe.format, cluster, stats)
            if (since is None or j.submit_s >= since) and (until is None or j.submit_s < until)
        ]
        if not jobs:
            raise UserError(f"{recipe.trace}: no job submitted in [--since, --until)")
        jobs = jobs[: recipe.limit] if recipe.limit is not None else jobs
    return _compressed(recipe, cluster, _shares(recipe, jobs, say), say)


def _shares(recipe: RunRecipe, jobs: list[TraceJob], say: Say) -> list[TraceJob]:
    """GPU shares (seeded), before compression so that `load` is the load of what runs."""
    fraction = recipe.share_fraction
    if not fraction:
        return jobs
    from shared.sim.share_jobs import describe_shares, mark_shares

    marked = mark_shares(jobs, fraction, recipe.seed)
    n = sum(a.gpu_milli != b.gpu_milli for a, b in zip(jobs, marked, strict=True))
    say(f"{describe_shares(fraction, recipe.seed)}; {n} of {len(marked)} jobs made shares")
    return marked


def _compressed(recipe: RunRecipe, cluster: ClusterSpec, jobs: list[TraceJob], say: Say) -> RunJobs:
    """The jobs replayed `repeat` times, their arrivals compressed to `load` if given."""
    from shared.sim.load import compress_to_load, repeat, span_load

    copies = recipe.repeat
    if copies != 1:
        n = len(jobs)
        jobs = repeat(jobs, copies)
        say(f"--repeat {copies}: the {n} jobs replayed {copies} times")
    if recipe.load is None:
        return RunJobs(jobs)
    basis = recipe.load_basis
    out, factor = compress_to_load(jobs, cluster, recipe.load, basis)
    say(
        f"--load {recipe.load} ({basis}): submission gaps divided by {factor:.4g}; of that "
        f"demand, {span_load(out, cluster):.3f} x capacity falls inside the submission span"
    )
    return RunJobs(out, factor)


def mark_offload(recipe: RunRecipe, jobs: list[TraceJob], say: Say = _stderr) -> list[TraceJob]:
    """A seeded `offload_fraction` of the jobs marked as offloading, said how."""
    from shared.sim.offload_jobs import describe_marking, mark_offloading

    if not recipe.offload_fraction:
        return jobs
    marked = mark_offloading(jobs, recipe.offload_fraction, recipe.seed)
    n = sum(1 for j in marked if j.param_bytes)
    say(
        f"{describe_marking(recipe.offload_fraction, recipe.seed)}; {n} of {len(marked)} "
        "jobs offload"
    )
    return marked
