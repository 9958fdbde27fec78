"""A service's own view of the free GPUs, kept from `NodeStatus` messages.

The view is the simulator's `ClusterState` (shared/sim/state.py), so that the
placement and scoring services hand the placer and the policy exactly what the
simulator hands them: `free_nodes()` in cluster order, the same fit tests, the
same fragmentation. A node's status replaces what the view knew of it; the
service's own allocations are taken off at once (`take`) so that two batches in a
row never offer the same GPU, and the next status of that node is the truth again.

With a cluster spec the node order is the spec's; without one (live hosts) nodes
are added in the order they first report.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.cluster import ClusterSpec, NodeSpec
from shared.messages import NodeStatus
from shared.placement_api import FULL_GPU, Allocation, NodeFree
from shared.sim.state import ClusterState

__all__ = ["FreeView", "free_row"]


def free_row(status: NodeStatus) -> list[int]:
    """Free milli-GPUs per GPU index of a status (`free_milli`, else whole GPUs)."""
    if status.free_milli is not None and len(status.free_milli) == status.gpus:
        return [min(max(m, 0), FULL_GPU) for m in status.free_milli]
    free = set(status.free_gpus)
    return [FULL_GPU if g in free else 0 for g in range(status.gpus)]


class FreeView:
    """Free milli-GPUs per node, as the latest `NodeStatus` of each node says."""

    def __init__(self, cluster: ClusterSpec | None = None) -> None:
        self._cluster = cluster or ClusterSpec(name="live", nodes=())
        self._state = ClusterState(self._cluster)
        self.round_of: dict[str, int] = {}  # node -> round_id of its latest status
        self.version = 0  # bumps on every change
        self.fixed = cluster is not None
        self._new: dict[str, NodeStatus] = {}  # nodes not in the state yet (added at once)

    @property
    def state(self) -> ClusterState:
        if self._new:
            self._add_nodes()
        return self._state

    @property
    def cluster(self) -> ClusterSpec:
        if self._new:
            self._add_nodes()
        return self._cluster

    def update(self, status: NodeStatus) -> None:
        """Take `status` as the truth about its node."""
        i = self._state.index.get(status.node_id)
        if i is None or self._state.size[i] != status.gpus:
            if self.fixed:
                raise ValueError(
                    f"node {status.node_id!r} with {status.gpus} GPUs is not in cluster "
                    f"{self._cluster.name!r}"
                )
            self._new[status.node_id] = status  # thousands reporting at start: one rebuild
        else:
            self._set_row(i, free_row(status))
        if status.round_id is not None:
            self.round_of[status.node_id] = status.round_id
        self.version += 1

    def take(self, allocations: Iterable[Allocation]) -> None:
        """Take off what this service just gave away (skips what is not free)."""
        st = self.state
        for a in allocations:
            for node_id, gpus in a.gpus:
                i = st.index.get(node_id)
                if i is None:
                    continue
                for g in gpus:
                    if 0 <= g < st.size[i] and st.free[i][g] >= a.gpu_milli:
                        st.release(((i, (g,)),), -a.gpu_milli)
        self.version += 1

    def free_nodes(self) -> list[NodeFree]:
        return self.state.free_nodes()

    @property
    def nodes(self) -> int:
        return len(self.state.node_ids)

    def _set_row(self, i: int, row: list[int]) -> None:
        st = self._state
        for g, want in enumerate(row):
            delta = want - st.free[i][g]
            if delta:
                st.release(((i, (g,)),), delta)  # adds `delta` milli to GPU g of node i

    def _add_nodes(self) -> None:
        """Rebuild the state with the new (or resized) nodes, keeping the others' rows."""
        new, self._new = self._new, {}
        old = self._state
        rows = {nid: list(old.free[i]) for i, nid in enumerate(old.node_ids) if nid not in new}
        rows.update({nid: free_row(s) for nid, s in new.items()})
        nodes = [n for n in self._cluster.nodes if n.node_id not in new]
        nodes += [NodeSpec(s.node_id, s.gpu_type, s.gpus) for s in new.values()]
        self._cluster = ClusterSpec(name=self._cluster.name, nodes=tuple(nodes))
        self._state = ClusterState(self._cluster)
        for nid, row in rows.items():
            j = self._state.index.get(nid)
            if j is not None and len(row) == self._state.size[j]:
                self._set_row(j, row)
