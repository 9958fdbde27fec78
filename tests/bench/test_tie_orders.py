"""bench.tie_orders: the slice flags become `simulate`'s own arguments."""

from __future__ import annotations

import argparse

from bench.tie_orders import add_slice_args, simulate_args


def _slice(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_slice_args(p, "rl,drf")
    return simulate_args(p.parse_args(list(argv)))


def test_slice_flags_reach_simulate() -> None:
    plain = _slice()
    assert (plain.since, plain.load, plain.share_fraction) == ("2017-10-15", None, 0.0)
    args = _slice("--load", "0.95", "--share-fraction", "0.3", "--until", "2017-10-20")
    assert (args.load, args.share_fraction, args.until) == (0.95, 0.3, "2017-10-20")
