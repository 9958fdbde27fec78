"""The placement service's view of the free GPUs against the simulator's own state."""

from __future__ import annotations

import random

import pytest

from services.placement.view import FreeView, free_row
from shared.cluster import ClusterSpec, NodeSpec
from shared.messages import NodeStatus
from shared.placement_api import Allocation
from shared.sim.state import ClusterState

CLUSTER = ClusterSpec(
    "t", (NodeSpec("a", "V100", 4), NodeSpec("b", "P100", 2), NodeSpec("c", "V100", 8))
)


def _status(node: NodeSpec, row: list[int], rid: int | None = None) -> NodeStatus:
    free = [g for g, m in enumerate(row) if m == 1000]
    return NodeStatus(node.node_id, node.gpu_type, node.gpus, free, round_id=rid, free_milli=row)


@pytest.mark.parametrize("seed", range(20))
def test_statuses_give_the_simulators_free_nodes(seed: int) -> None:
    """Random claims on the simulator's state, reported as NodeStatus: the view's
    free nodes, fit tests and fragmentation are the simulator's."""
    rng = random.Random(seed)
    truth = ClusterState(CLUSTER)
    view = FreeView(CLUSTER)
    for step in range(30):
        node = rng.choice(CLUSTER.nodes)
        g = rng.randrange(node.gpus)
        milli = rng.choice([1000, 500, 250])
        truth.claim(Allocation(f"j{step}", ((node.node_id, (g,)),), milli), 1)
        i = truth.index[node.node_id]
        view.update(_status(node, list(truth.free[i]), step))
        assert view.free_nodes() == truth.free_nodes()
        for types in (frozenset(), frozenset({"P100"}), frozenset({"V100"})):
            for n, m in ((1, 1000), (1, 300), (3, 1000), (9, 1000)):
                assert view.state.fits(n, m, types) == truth.fits(n, m, types)
        assert view.state.fragmentation() == truth.fragmentation()
        assert view.round_of[node.node_id] == step


def test_take_removes_what_was_given_and_a_status_restores_the_truth() -> None:
    view = FreeView(CLUSTER)
    view.take([Allocation("x", (("a", (0, 1)),)), Allocation("y", (("b", (1,)),), 500)])
    free = {n.node_id: n.free_milli for n in view.free_nodes()}
    assert free["a"] == (0, 0, 1000, 1000) and free["b"] == (1000, 500)
    view.update(_status(CLUSTER.nodes[0], [1000] * 4))
    assert {n.node_id: n.free_milli for n in view.free_nodes()}["a"] == (1000,) * 4


def test_live_nodes_join_in_report_order_and_unknown_nodes_are_refused_with_a_spec() -> None:
    live = FreeView()
    live.update(NodeStatus("h2", "A100", 2, [1]))
    live.update(NodeStatus("h1", "V100", 4, [0, 1, 2, 3]))
    assert [n.node_id for n in live.free_nodes()] == ["h2", "h1"]
    assert live.free_nodes()[0].free_milli == (0, 1000)
    assert live.cluster.gpus_by_type() == {"A100": 2, "V100": 4}
    with pytest.raises(ValueError, match="not in cluster"):
        FreeView(CLUSTER).update(NodeStatus("zz", "V100", 4, []))


def test_free_row_falls_back_to_whole_gpus() -> None:
    assert free_row(NodeStatus("n", "V100", 3, [0, 2])) == [1000, 0, 1000]
    assert free_row(NodeStatus("n", "V100", 2, [], free_milli=[1200, -5])) == [1000, 0]
