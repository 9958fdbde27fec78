"""bench/priority.py: per-class figures from per-segment rows worked by hand, and a
short run where turning `preempt_lower` on gives priority preemptions and off none."""

from __future__ import annotations

from pathlib import Path

from bench.priority import per_class, run
from tests.integration.streaming import SMALL_CLUSTER


def test_per_class_from_segments_by_hand() -> None:
    rows = [  # a stopped at 100 and run again 200..500; b waits 50 s; c alone in its class
        {"job_id": "a", "submit_s": "0", "start_s": "0", "finish_s": "100"},
        {"job_id": "a", "submit_s": "0", "start_s": "200", "finish_s": "500"},
        {"job_id": "b", "submit_s": "10", "start_s": "60", "finish_s": "1810"},
        {"job_id": "c", "submit_s": "0", "start_s": "3600", "finish_s": "7200"},
        {"job_id": "d", "submit_s": "5", "start_s": "", "finish_s": ""},  # rejected
    ]
    got = per_class(rows, {"a": "low", "b": "low", "c": "high", "d": "high"})
    assert got["low"] == {"jobs": 2, "avg_jct_h": (500 + 1800) / 2 / 3600, "avg_wait_h": 25 / 3600}
    assert got["high"] == {"jobs": 1, "avg_jct_h": 2.0, "avg_wait_h": 1.0}


def test_a_short_run_preempts_only_when_on(tmp_path: Path) -> None:
    cluster = tmp_path / "small.yaml"
    cluster.write_text(SMALL_CLUSTER)
    res = run(cluster, 60, 3, "fifo", tmp_path / "out")
    off, on = res["off"], res["on"]
    assert isinstance(off, dict) and isinstance(on, dict)
    assert off["preemptions_by_reason"] == {}
    assert on["preemptions_by_reason"].get("priority", 0) > 0
    assert on["restart_lost_gpu_h"] > 0 == off["restart_lost_gpu_h"]
    assert sum(c["jobs"] for c in on["classes"].values()) == 53  # 7 of 60 do not fit
