"""bench.offload_orders's accounting, on rows written by hand."""

from __future__ import annotations

import pytest

from bench.offload_orders import _seeds, summarise, whole_target


def test_whole_target_by_hand() -> None:
    base = {"others": 100.0, "offloading": 200.0, "all": 130.0, "slowdown": 0.5}
    good = {"others": 99.0, "offloading": 150.0, "all": 114.0, "slowdown": 0.35}  # cut 30%
    assert whole_target(good, base)
    assert not whole_target({**good, "slowdown": 0.36}, base)  # cut 28%
    assert not whole_target({**good, "others": 100.5}, base)  # one group higher


def test_seed_ranges() -> None:
    assert _seeds("0-3,7") == [0, 1, 2, 3, 7]


def test_placebo_pairs_and_the_mean_over_orders(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 0 in orders a, b, c: the placebo pairs are a->b, b->c, c->a, its `others`
    moving 100 -> 110 -> 99 -> 100, so 'no group higher' fails at a->b and c->a (the
    other groups stay equal). The placer beats the placebo only in order b, and not
    on the means over the orders (104 against 103)."""
    rows = []
    others = {"a": 100.0, "b": 110.0, "c": 99.0}
    for o, v in others.items():
        rows.append({"seed": 0, "order": o, "placer": "p0", "others": v, "offloading": 200.0,
                     "all": 150.0, "slowdown": 0.5})  # fmt: skip
        rows.append({"seed": 0, "order": o, "placer": "p1", "others": 104.0, "offloading": 190.0,
                     "all": 140.0, "slowdown": 0.3})  # fmt: skip
    rows.append(
        {
            "seed": 1,
            "order": "a",
            "placer": "p0",
            "others": 1.0,
            "offloading": 1.0,
            "all": 1.0,
            "slowdown": 1.0,
        }
    )  # fmt: skip  (an incomplete seed: left out)
    summarise(rows, "p0", "")
    err = capsys.readouterr().err
    assert "3 pairs over 1 seeds" in err
    assert "'no group higher' fails in 2 of 3 pairs" in err  # a->b (+10%), c->a (+1.0%)
    # p1 against p0: runs a (104 > 100) and c (104 > 99) fail, b passes; the means
    # (104 against 103) fail too
    assert "in 1 of 3 runs (seed x order)" in err
    assert "0 of 1 seeds" in err


def test_per_seed_table_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 3 in orders a, b: the placebo's slowdown 0.4 and 0.6 (mean 0.5), the
    placer's 0.2 and 0.4 (mean 0.3): cut 1 - 0.3/0.5 = 40%. Jobs that do not offload:
    means 100 and 102 (+2.0%); offloading 200 -> 180 (-10.0%); all 150 -> 135
    (-10.0%). Order a: cut 50% with `others` 101 > 100, so no; order b: cut 1/3 with
    103 > 100, no."""
    rows = []
    for o, (s0, s1, x1) in {"a": (0.4, 0.2, 101.0), "b": (0.6, 0.4, 103.0)}.items():
        rows.append({"seed": 3, "order": o, "placer": "p0", "others": 100.0,
                     "offloading": 200.0, "all": 150.0, "slowdown": s0})  # fmt: skip
        rows.append({"seed": 3, "order": o, "placer": "p1", "others": x1,
                     "offloading": 180.0, "all": 135.0, "slowdown": s1})  # fmt: skip
    summarise(rows, "p0", "")
    err = capsys.readouterr().err
    assert "| 3 | 0.500 | 0.300 | 40.0% | +2.0% | -10.0% | -10.0% | nn |" in err
    # the same with `others` no higher in order b: that order meets the target
    rows[3]["others"] = 100.0
    summarise(rows, "p0", "")
    assert "| 3 | 0.500 | 0.300 | 40.0% | +0.5% | -10.0% | -10.0% | ny |" in capsys.readouterr().err
