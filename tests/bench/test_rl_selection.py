"""bench.rl_selection: the fixed protocols and the summary the choice is made on."""

from __future__ import annotations

import pytest

from bench.rl_selection import PROTOCOLS, summarise
from shared.cluster import load_cluster


def _row(setting: str, seed: int, policy: str, bsld: float, jct: float, big: float) -> dict:
    return {"protocol": "validation", "setting": setting, "seed": seed, "policy": policy,
            "avg_bsld": bsld, "avg_jct_h": jct, "gpu_util": 0.5, "big_max_wait_h": big}  # fmt: skip


def test_summary_against_hand_computed_ratios_and_fifo_waits() -> None:
    rows = [
        _row("s1", -1, "drf", 2.0, 3.0, 5.0), _row("s1", -1, "fifo", 4.0, 3.0, 6.0),
        _row("s1", -1, "x", 1.0, 2.0, 7.0),  # ratio 0.5; 7 h > fifo's 6 h
        _row("s2", 1, "drf", 4.0, 5.0, 1.0), _row("s2", 1, "fifo", 8.0, 5.0, 2.0),
        _row("s2", 1, "x", 5.0, 4.0, 2.0),  # ratio 1.25; 2 h, equal to fifo's: not worse
    ]  # fmt: skip
    s = summarise(rows)["validation"]
    assert s["x"]["ratio"] == pytest.approx((0.5 + 1.25) / 2 - 1)  # -12.5%
    assert s["x"]["jct_h"] == pytest.approx(3.0) and s["x"]["runs"] == 2
    assert s["x"]["big_worse"] == 1 and s["x"]["big_excess_h"] == pytest.approx(1.0)
    assert s["drf"]["big_excess_h"] == pytest.approx(-1.0)  # 5 - 6 and 1 - 2
    assert s["drf"]["ratio"] == pytest.approx(0.0) and s["drf"]["big_worse"] == 0
    assert s["fifo"]["ratio"] == pytest.approx(1.0)


def test_validation_never_uses_a_held_out_week_or_cluster() -> None:
    """The settings that choose stop at 2017-10-15 and run on a shape that neither
    a training nor a held-out cluster has (GPU types and server sizes)."""
    val, seeds = PROTOCOLS["validation"]
    assert len(seeds) >= 3 and any(float(s.load) > 1.0 for s in val)

    def shape(path: str) -> frozenset[tuple[str, int]]:
        return frozenset((n.gpu_type, n.gpus) for n in load_cluster(path).nodes)

    others = [
        "clusters/train/p100-v100.yaml", "clusters/train/p100.yaml",
        "clusters/train/t4-v100-a100.yaml", "clusters/train/k80-v100.yaml",
        "clusters/philly-hetero.yaml", "clusters/philly-hetero-small.yaml",
    ]  # fmt: skip
    for st in val:
        assert st.until <= "2017-10-15" and st.since >= "2017-10-05"
        assert all(shape(st.cluster) != shape(o) for o in others)
    for name in ("heldout", "small"):
        assert all(st.since >= "2017-10-15" for st in PROTOCOLS[name][0])
