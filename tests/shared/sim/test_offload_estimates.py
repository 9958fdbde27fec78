"""OffloadState.estimate keeps its answers by node signature across starts and stops.
The key must hold everything the estimate reads: after random starts and stops on a
cluster whose nodes differ in every field the cost model reads, every kept answer
equals the one a fresh state (only the running jobs started, nothing kept) computes,
to the bit."""

from __future__ import annotations

from random import Random

import pytest

from shared.cluster import parse_cluster
from shared.sim.offload_jobs import BYTES_PER_PARAM
from shared.sim.offload_state import OffloadState

# node kinds that differ in GPU type, GPU count, PCIe, NVMe and host memory per GPU;
# p100x4 and v100x4 differ only in type, p100x4 and p100x4-slow only in bandwidth,
# p100x4 and p100x4-small only in host memory
CLUSTER = parse_cluster(
    {"name": "mixed", "reference": "V100",
     "nodes": [
         {"name": "p100x4", "gpu_type": "P100", "gpus": 4, "count": 3},
         {"name": "v100x4", "gpu_type": "V100", "gpus": 4, "count": 3},
         {"name": "p100x4-slow", "gpu_type": "P100", "gpus": 4, "count": 2,
          "pcie_gbps": 8, "nvme_gbps": 1.5},
         {"name": "p100x4-small", "gpu_type": "P100", "gpus": 4, "count": 2,
          "host_mem_gib": 64},
         {"name": "p100x2", "gpu_type": "P100", "gpus": 2, "count": 3},
     ]}
)  # fmt: skip
STEPS = 40
SIZES = [int(b * 1e9 * BYTES_PER_PARAM) for b in (0.34, 1.56, 2.85, 6.05)]


def _fresh(st: OffloadState, running: dict[int, list[tuple[int, int]]]) -> OffloadState:
    """A state with only the running jobs, started in a shuffled order, nothing kept."""
    new = OffloadState(CLUSTER)
    new._demand = st._demand  # each job size's traffic plan (not what is tested here)
    for seq in running:
        new.add_job(seq, f"j{seq}", st.param_bytes[seq], st.gpus[seq])
    for seq in sorted(running, key=lambda q: (q * 7919) % 101):
        new.start(seq, running[seq])
    return new


@pytest.mark.parametrize("seed", range(8))
def test_kept_estimates_equal_fresh_ones(seed: int) -> None:
    rng = Random(seed)
    st = OffloadState(CLUSTER)
    nodes = list(CLUSTER.nodes)
    running: dict[int, list[tuple[int, int]]] = {}
    asked = 0
    for seq in range(STEPS):
        if running and rng.random() < 0.35:
            gone = rng.choice(sorted(running))
            st.stop(gone)
            del running[gone]
        g = rng.choice((1, 1, 2, 4))
        st.add_job(seq, f"j{seq}", rng.choice(SIZES), g)
        i = rng.randrange(len(nodes))
        running[seq] = [(i, min(g, nodes[i].gpus))]
        st.start(seq, running[seq])
        fresh = _fresh(st, running)
        for _ in range(3):
            what = (rng.choice(SIZES), rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4)),
                    rng.choice((0, 0, 1, 2)))  # fmt: skip
            for n in nodes:
                args = (what[0], what[1], n.node_id, what[2], what[3])
                assert st.estimate(*args) == fresh.estimate(*args), args
                asked += 1
    assert asked == STEPS * 3 * len(nodes)
    # the comparison means something only if kept answers were given out (nodes of one
    # kind without jobs, and states that return to an earlier signature): more than a
    # quarter of the answers here
    assert len(st._estimates) < 0.75 * asked
