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
