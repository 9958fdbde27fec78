"""Offload-aware placement (services/placement/offload_term.py): hand-solved
instances with a literal view, and the order rule kept in simulation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.placement.greedy import GreedyPlacer
from services.placement.milp import MilpConfig, MilpPlacer
from services.placement.offload_term import OffloadAwarePlacer, offload_cost
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cluster import load_cluster
from shared.placement_api import JobRequest, NodeFree
from shared.sim import SimConfig, load_jobs, simulate
from shared.sim.offload_jobs import mark_offloading
from shared.traces import SkipStats

ROOT = Path(__file__).resolve().parents[3]


class View:
    """Node `busy` already has one offloading GPU: a job there runs 2x slower and
    slows the one there by 0.5; elsewhere it runs alone at 1.25x, and beside another
    one placed in the same window 2x slower, slowing that one by 0.5."""

    def __init__(self, offloading: set[str]) -> None:
        self.offloading = offloading

    def job(self, job_id: str) -> tuple[int, int] | None:
        return (1, 1) if job_id in self.offloading else None

    def streams_on(self, node_id: str) -> int:
        return 1 if node_id == "busy" else 0

    def estimate(
        self, param_bytes: int, gpus: int, node_id: str, take: int, extra: int = 0
    ) -> tuple[float, float]:
        if node_id == "busy" or extra:
            return 2.0, 0.5
        return 1.25, 0.0


# best fit (greedy.py) prefers `busy`: fewer whole free GPUs
NODES = [NodeFree("busy", "V100", (0, 1000)), NodeFree("idle", "V100", (1000, 1000))]
SPEED = {"V100": 1.0}


def _wrapped(inner: object, offloading: set[str]) -> OffloadAwarePlacer:
    p = OffloadAwarePlacer(inner)  # type: ignore[arg-type]
    p.offload_view = View(offloading)
    return p


@pytest.mark.parametrize("inner", [GreedyPlacer(), MilpPlacer(MilpConfig(time_limit_s=5.0))])
def test_offloading_job_avoids_the_busy_node(inner: object) -> None:
    job = JobRequest("j", 1)
    plain = inner.place([job], NODES, SPEED)  # type: ignore[attr-defined]
    assert plain.allocations[0].node_ids == ("busy",)
    aware = _wrapped(inner, {"j"}).place([job], NODES, SPEED)
    assert aware.allocations[0].node_ids == ("idle",)
    # a job that does not offload is placed as the wrapped placer places it
    assert _wrapped(inner, set()).place([job], NODES, SPEED).allocations == plain.allocations


class Pairs(View):
    """As View, but on `busy` a job runs 1.6x slower and slows the one there by 0.4."""

    def estimate(
        self, param_bytes: int, gpus: int, node_id: str, take: int, extra: int = 0
    ) -> tuple[float, float]:
        if node_id == "busy":
            return 1.6, 0.4
        return (2.0, 0.5) if extra else (1.25, 0.0)


@pytest.mark.parametrize("inner", [GreedyPlacer(), MilpPlacer(MilpConfig(time_limit_s=5.0))])
def test_two_offloading_jobs_of_one_window_are_charged_for_each_other(inner: object) -> None:
    """Two 1-GPU offloading jobs, one GPU free on `busy` and two on `idle`. Together on
    `idle` they cost each other: x = (1 − 1/2) + 0.5 = 1.0 each, 2.0 in all; one on
    `busy` (x = 1 − 1/1.6 + 0.4 = 0.775) and one alone on `idle` (x = 0.2) cost 0.975.
    Both placers split them (the MILP through the charge on the node pattern with two
    streaming slots); without the same-window charge the MILP put both on `idle`."""
    jobs = [JobRequest("a", 1), JobRequest("b", 1)]
    p = OffloadAwarePlacer(inner)  # type: ignore[arg-type]
    p.offload_view = Pairs({"a", "b"})
    res = p.place(jobs, NODES, SPEED)
    assert sorted(a.job_id for a in res.allocations) == ["a", "b"]
    assert sorted(a.node_ids for a in res.allocations) == [("busy",), ("idle",)]
    # the same two jobs, one of them not offloading: nothing to share, both on `idle`
    # for the MILP (the offloading one avoids `busy`; packing keeps the other beside it)
    p.offload_view = Pairs({"a"})
    res = p.place(jobs, NODES, SPEED)
    assert dict((a.job_id, a.node_ids) for a in res.allocations)["a"] == ("idle",)


def test_offload_cost_of_a_job_that_does_not_offload_is_zero() -> None:
    v = View({"x"})
    assert offload_cost(v, JobRequest("y", 1), "busy") == 0.0
    assert offload_cost(v, JobRequest("x", 1), "busy") == pytest.approx(0.5 + 0.5)


def test_order_rule_kept_and_offload_slowdown_cut_on_a_philly_slice() -> None:
    cluster = load_cluster(ROOT / "clusters" / "philly.yaml")
    jobs = load_jobs(ROOT / "examples" / "philly-2000.jsonl", "jsonl", cluster, SkipStats(), 600)
    jobs = mark_offloading(jobs, 0.3, seed=0)
    out: dict[str, dict[str, Any]] = {}
    for name in ("milp", "milp+offload", "greedy+offload"):
        placer = make_placer(name, reproducible=True)
        res = simulate(jobs, cluster, make_policy("fifo"), placer, SimConfig())
        s = res.summary()
        assert s["priority_inversions"] == 0, name
        out[name] = s
    assert out["milp+offload"]["offload_slowdown"] < out["milp"]["offload_slowdown"]
    assert out["greedy+offload"]["offload_slowdown"] < out["milp"]["offload_slowdown"]
