"""Free capacity after a placement: what the next window (or the packing run) sees."""

from __future__ import annotations

from collections.abc import Sequence

from shared.placement_api import Allocation, NodeFree

__all__ = ["apply_allocations"]


def apply_allocations(nodes: Sequence[NodeFree], allocs: Sequence[Allocation]) -> list[NodeFree]:
    """`nodes` with each allocation's share taken off its GPUs (inputs unchanged)."""
    pos = {n.node_id: i for i, n in enumerate(nodes)}
    rows: dict[int, list[int]] = {}
    for a in allocs:
        for node_id, idx in a.gpus:
            i = pos[node_id]
            row = rows.setdefault(i, list(nodes[i].free_milli))
            for g in idx:
                row[g] -= a.gpu_milli
    out = list(nodes)
    for i, row in rows.items():
        out[i] = NodeFree(nodes[i].node_id, nodes[i].gpu_type, tuple(row))
    return out
