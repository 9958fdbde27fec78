"""Re-placement issued by the placement service (services/placement/moves.py through
PlacementState): the hand-solved two-node run of test_replace.py, driven by the
messages the service reads, gives the simulator's move as a `MoveOrder`."""

from __future__ import annotations

import msgspec
import pytest

from services.placement.registry import make_placer
from services.placement.rounds import PlacementState
from shared.messages import (
    Job,
    JobEvent,
    NodeStatus,
    OffloadRunning,
    OffloadSpec,
    PlacementBatch,
    RoundRequest,
)
from shared.sched.ordered import OrderedPlacer
from shared.sched.replacement import ReplaceConfig, restart_cost_s
from tests.services.placement.test_replace import CLUSTER, GPT2XL, H, _slowdown

CFG = ReplaceConfig(min_gain=0.1)


def _state(name: str = "greedy+offload+replace") -> PlacementState:
    placer = OrderedPlacer(make_placer(name, reproducible=True, replace=CFG), "easy")
    st = PlacementState(placer, CLUSTER)
    for n in CLUSTER.nodes:
        st.node(NodeStatus(n.node_id, n.gpu_type, n.gpus, list(range(n.gpus))))
    st.accepted(Job("z", 2, 0.0))
    for j in ("x", "y"):
        st.accepted(Job(j, 1, 1.0, duration_hint_s=H, offload=OffloadSpec(GPT2XL)))
    return st


def _start(st: PlacementState, batch: PlacementBatch, t: float) -> dict[str, str]:
    nodes = {}
    for a in batch.assignments:
        nodes[a.job_id] = a.node_id
        st.event(JobEvent(a.job_id, "started", t, [a.node_id]))
    return nodes


def _free(st: PlacementState, node: str) -> None:
    st.node(NodeStatus(node, "V100", 2, [0, 1]))


@pytest.mark.parametrize("name", ["greedy+offload+replace", "milp+offload+replace"])
def test_the_service_moves_x_when_zs_node_frees(name: str) -> None:
    """z holds a node for 8 h; x and y share the other's link from t = 1. At 8 h z
    finishes; the next round's batch moves x (first by id) to z's node, with the
    restart cost and the saving of replace.py worked out by hand; y stays (x has left
    its node, so y runs alone there), and no second move is issued for x."""
    st = _state(name)
    zb = st.free_round(1, 0.0, [("z", 1.0)])
    zn = _start(st, zb, 0.0)["z"]
    other = ({"a", "b"} - {zn}).pop()
    xy = st.free_round(2, 1.0, [("x", 2.0), ("y", 1.0)])
    assert {a.node_id for a in xy.assignments} == {other} and not xy.moves
    _start(st, xy, 1.0)
    early = st.free_round(3, 7 * H, [])  # z still runs: nowhere to go
    assert early.moves == []
    st.event(JobEvent("z", "finished", 8 * H, [zn]))
    _free(st, zn)
    b = st.free_round(4, 8 * H, [])
    f1, f2 = _slowdown(1), _slowdown(2)
    assert len(b.moves) == 1
    mv = b.moves[0]
    assert mv.job_id == "x" and [a.node_id for a in mv.assignments] == [zn]
    assert mv.restart_s == pytest.approx(restart_cost_s(GPT2XL, CFG))
    # before f2; after f1 + 0 (nobody to slow on zn) − (f2 − f1) (y relieved)
    elapsed = 8 * H - 1.0
    assert mv.saved_s == pytest.approx((f2 - (f1 - (f2 - f1))) * elapsed / f2, rel=1e-9)
    assert st.offload is not None and st.offload.state.streams_on(other) == 1
    again = st.free_round(5, 8 * H + 60, [])
    assert again.moves == []  # x's move not confirmed yet; y alone gains nothing
    st.event(JobEvent("x", "started", 8 * H + 5, [zn]))
    assert st.offload.running["x"].start_s == 8 * H + 5
    assert st.offload.running["x"].before_s == pytest.approx(8 * H + 5 - 1.0)


def test_a_driven_replace_round_gives_the_free_rounds_move() -> None:
    """Lockstep: a driven place round carries no move; a `replace` request naming the
    running offloading jobs as the executor holds them gets the move a free round gets
    at the same point, from the request alone (this service read no job event)."""
    free = _state()
    zn = _start(free, free.free_round(1, 0.0, [("z", 1.0)]), 0.0)["z"]
    xy = free.free_round(2, 1.0, [("x", 2.0), ("y", 1.0)])
    _start(free, xy, 1.0)
    free.event(JobEvent("z", "finished", 8 * H, [zn]))
    _free(free, zn)
    (want,) = free.free_round(3, 8 * H, []).moves

    st = _state()
    other = xy.assignments[0].node_id
    st.node(NodeStatus(other, "V100", 2, []))
    running = [
        OffloadRunning(a.job_id, GPT2XL, 1, [(a.node_id, a.gpu_indices)], 8 * H - 1.0, H)
        for a in xy.assignments
    ]
    st.request(RoundRequest(3, 8 * H, "score"))
    st.request(RoundRequest(3, 8 * H, "place", offloading=running))
    (placed,) = st.answer_rounds()
    assert placed.round_id == 3 and placed.moves == [] and placed.assignments == []
    st.request(RoundRequest(4, 8 * H, "replace", offloading=running))
    (got,) = st.answer_rounds()
    assert got.round_id == 4 and got.assignments == [] and got.moves == [want]
    # a job still restoring a move's checkpoint is not moved; a driven answer rebuilds
    # the view from each request
    busy = [msgspec.structs.replace(r, restoring=True) for r in running]
    _free(st, zn)  # (the move not applied: the executor's state is as before)
    st.request(RoundRequest(5, 8 * H, "replace", offloading=busy))
    (none,) = st.answer_rounds()
    assert none.moves == []
    _free(st, zn)
    st.request(RoundRequest(6, 8 * H, "replace", offloading=running))
    assert st.answer_rounds()[0].moves == [msgspec.structs.replace(want)]


def test_a_refused_move_puts_the_job_back() -> None:
    st = _state()
    zn = _start(st, st.free_round(1, 0.0, [("z", 1.0)]), 0.0)["z"]
    other = ({"a", "b"} - {zn}).pop()
    _start(st, st.free_round(2, 1.0, [("x", 2.0), ("y", 1.0)]), 1.0)
    st.event(JobEvent("z", "finished", 8 * H, [zn]))
    _free(st, zn)
    assert st.free_round(3, 8 * H, []).moves
    assert st.offload is not None and st.offload.state.streams_on(zn) == 1
    st.event(JobEvent("x", "rejected_placement", 8 * H + 1, [zn], "GPU busy"))
    assert st.offload.state.streams_on(zn) == 0 and st.offload.state.streams_on(other) == 2
    assert st.offload.running["x"].start_s == 1.0  # its segment goes on


def test_plain_and_offload_only_placers_issue_no_moves() -> None:
    for name in ("greedy", "greedy+offload"):
        placer = OrderedPlacer(make_placer(name, reproducible=True), "easy")
        st = PlacementState(placer, CLUSTER)
        for n in CLUSTER.nodes:
            st.node(NodeStatus(n.node_id, n.gpu_type, n.gpus, list(range(n.gpus))))
        st.accepted(Job("x", 1, 0.0, offload=OffloadSpec(GPT2XL)))
        b = st.free_round(1, 0.0, [("x", 1.0)])
        st.event(JobEvent("x", "started", 0.0, [b.assignments[0].node_id]))
        assert st.free_round(2, 100 * H, []).moves == []
        assert (st.offload is not None) == name.endswith("+offload")


def test_an_offload_placer_without_a_cluster_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rltune import main

    assert main(["service", "placement", "--placer", "milp+offload+replace"]) == 2
    err = capsys.readouterr().err
    assert "needs --cluster" in err and err.count("\n") == 1
