"""The capabilities a placer declares (shared/sched/replacement.py), read by the
simulator: re-placement is on exactly for the `NAME+offload+replace` placers, the
offload view is handed exactly to the `+offload` ones, and the GC is collected by the
solver's count exactly for the MILP-based ones, whatever wraps them."""

from __future__ import annotations

import pytest

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cluster import ClusterSpec, NodeSpec
from shared.sched.ordered import OrderedPlacer
from shared.sched.replacement import LeavesCycles, OffloadAware, Replacing
from shared.sim import SimConfig, Simulator

NAMES = [
    "greedy", "first-fit", "best-fit", "fgd", "milp", "greedy+offload", "milp+offload",
    "greedy+offload+replace", "milp+offload+replace",
]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_what_each_placer_declares(name: str) -> None:
    placer = make_placer(name, reproducible=True)
    replaces = isinstance(placer, Replacing) and placer.replace is not None
    assert replaces == name.endswith("+offload+replace")
    assert isinstance(placer, OffloadAware) == ("+offload" in name)
    cycles = isinstance(placer, LeavesCycles) and placer.leaves_cycles
    assert cycles == name.startswith("milp")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("wrapped", [False, True])
def test_the_simulator_reads_them_through_the_order_wrapper(name: str, wrapped: bool) -> None:
    cluster = ClusterSpec("c", (NodeSpec("n", "P100", 2),))
    placer = make_placer(name, reproducible=True)
    given = OrderedPlacer(placer, "easy") if wrapped else placer
    sim = Simulator(cluster, make_policy("fifo"), given, SimConfig())
    assert (sim.replacing is not None) == name.endswith("+offload+replace")
    assert sim._collect == name.startswith("milp")
    view = getattr(placer, "offload_view", None)
    assert (view is sim.offload) == ("+offload" in name)
