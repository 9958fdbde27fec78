"""Every placer's answer passes the independent checker on random cluster states."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from services.placement.milp import MilpConfig, MilpPlacer
from services.placement.registry import PLACERS, make_placer
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree
from shared.sched.checker import violations
from tests.services.placement.strategies import jobs, nodes

SPEED = {"A": 1.0, "B": 2.0}
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(SETTINGS, max_examples=1500)
@given(nodes(), jobs())
def test_baselines_feasible(cluster: list[NodeFree], window: list[JobRequest]) -> None:
    for name in PLACERS:
        if name == "milp":
            continue
        res = make_placer(name).place(window, cluster, SPEED)
        assert violations(window, cluster, res.allocations) == [], name


@settings(SETTINGS, max_examples=1000)
@given(nodes(max_nodes=8), jobs(max_jobs=16, max_gpus=12))
def test_milp_feasible(cluster: list[NodeFree], window: list[JobRequest]) -> None:
    res = MilpPlacer(MilpConfig(time_limit_s=1.0)).place(window, cluster, SPEED)
    assert violations(window, cluster, res.allocations) == []
    assert res.status in ("OPTIMAL", "TIMEOUT_FEASIBLE", "TIMEOUT_HINT", "FALLBACK_GREEDY")
    assert res.objective is not None and res.solver_ms > 0


def test_checker_catches_each_rule() -> None:
    cluster = [NodeFree("a", "A", (1000, 500)), NodeFree("b", "B", (1000,))]
    window = [
        JobRequest("whole", 2, gpu_types=frozenset({"A"})),
        JobRequest("share", 1, 600),
    ]
    bad = [
        Allocation("whole", (("a", (0,)),)),  # gang: 1 of 2 GPUs
        Allocation("share", (("a", (1,)),), 600),  # 600 > 500 free
        Allocation("ghost", (("b", (0,)),)),  # not in the window
    ]
    found = violations(window, cluster, bad)
    assert any("gang" in v for v in found)
    assert any("600 milli given, 500 free" in v for v in found)
    assert any("not in the window" in v for v in found)
    typed = [Allocation("whole", (("a", (0,)), ("b", (0,))))]
    assert any("type B not allowed" in v for v in violations(window, cluster, typed))
    twice = [Allocation("share", (("b", (0,)),), 600), Allocation("share", (("b", (0,)),), 600)]
    assert any("placed twice" in v for v in violations(window, cluster, twice))
    wrong = [Allocation("share", (("b", (0,)),), FULL_GPU)]
    assert any("share 1000 != requested 600" in v for v in violations(window, cluster, wrong))
