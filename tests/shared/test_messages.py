"""Internal messages are checked as strictly as a JobSpec when decoded: each broken
or forged `NodeStatus` and `OffloadStats` below is refused with a reason that names
the field, and every well-formed one (what the simulator and the host agents send)
decodes to itself."""

from __future__ import annotations

import msgspec
import pytest

from shared.messages import NodeStatus, OffloadStats, encode

GOOD_NODE = {"node_id": "v100-0", "gpu_type": "V100", "gpus": 8, "free_gpus": [0, 3, 7]}
GOOD_STATS = {"job_id": "j1", "node_id": "v100-0", "hit_rate": 0.93, "migration_ms_p99": 4.5}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus": -8}, "$.gpus"),
        ({"gpus": 5000}, "$.gpus"),
        ({"free_gpus": [0, 8]}, "$.free_gpus"),  # index past the node's GPUs
        ({"free_gpus": [-1]}, "$.free_gpus"),
        ({"free_gpus": [1, 1]}, "$.free_gpus"),
        ({"free_milli": [1000] * 3}, "$.free_milli"),  # not one per GPU
        ({"free_milli": [1001] * 8}, "$.free_milli"),
        ({"gpu_util": 7.5}, "$.gpu_util"),
        ({"pcie_gbps": -1.0}, "$.pcie_gbps"),
        ({"node_id": ""}, "$.node_id"),
        ({"round_id": -3}, "$.round_id"),
    ],
)
def test_broken_node_status_names_the_field(change: dict[str, object], field: str) -> None:
    raw = msgspec.json.encode({**GOOD_NODE, **change})
    with pytest.raises(msgspec.ValidationError, match=field.replace("$", r"\$")):
        msgspec.json.decode(raw, type=NodeStatus)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hit_rate": 7.5}, "$.hit_rate"),
        ({"hit_rate": -0.1}, "$.hit_rate"),
        ({"migration_ms_p99": 1e308}, "$.migration_ms_p99"),
        ({"migration_ms_p50": -2.0}, "$.migration_ms_p50"),
        ({"bytes_in": -1}, "$.bytes_in"),
        ({"step_ms": "INF"}, "$.step_ms"),  # 1e400: JSON's way to infinity
        ({"job_id": "no spaces allowed"}, "$.job_id"),
    ],
)
def test_broken_offload_stats_name_the_field(change: dict[str, object], field: str) -> None:
    raw = msgspec.json.encode({**GOOD_STATS, **change}).replace(b'"INF"', b"1e400")
    with pytest.raises(msgspec.ValidationError, match=field.replace("$", r"\$")):
        msgspec.json.decode(raw, type=OffloadStats)


def test_what_the_senders_send_decodes_to_itself() -> None:
    nodes = [
        NodeStatus("a", "V100", 8, list(range(8))),
        NodeStatus("b", "A100", 4, [], gpu_util=1.0, gpu_mem_used=0.5, round_id=0),
        NodeStatus("c", "T4", 2, [1], free_milli=[250, 1000], source="simulated"),
        NodeStatus("cpu", "none", 0, []),
    ]
    for n in nodes:
        assert msgspec.json.decode(encode(n), type=NodeStatus) == n
    stats = OffloadStats("j1", "a", 1.0, 0.0, 86_400_000.0, 0, 2**40, 1.7, 0.2, 310.0, 5.0)
    assert msgspec.json.decode(encode(stats), type=OffloadStats) == stats
