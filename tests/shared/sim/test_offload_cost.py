"""The simulator's offload cost model (shared/sim/offload_cost.py, offload_traffic.py).

The bench reproduction uses the stored calibration (shared/sim/offload_calibration.json:
two `rltune bench offload --json` runs on this machine): constants fitted on the
first run, step times of the second (held out) predicted from its recorded profile
and its `none` step time alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.offload_calibration import with_profile
from shared.messages import TensorProfile
from shared.offload.planner import Budgets
from shared.sim.offload_cost import (
    CALIBRATION_FILE,
    bench_traffic,
    fit_calibration,
    load_calibration,
    predict_bench,
    step_cost,
)
from shared.sim.offload_traffic import Traffic, step_traffic

RUNS = json.loads(CALIBRATION_FILE.read_text())


@pytest.mark.parametrize("strategy", ["lru", "fixed", "tencache"])
def test_held_out_bench_step_times_within_15_percent(strategy: str) -> None:
    """Against the held-out run's measured step times (`none` is left out: the
    prediction takes its step time as the compute, so it could not miss)."""
    run = RUNS["validate"]
    pred = predict_bench(run, load_calibration())[strategy]
    measured = run[strategy]["step_ms"]
    assert abs(pred - measured) <= 0.15 * measured, (strategy, pred, measured)


def test_stored_constants_are_the_fit_of_the_calibration_run() -> None:
    cal, stored = fit_calibration(RUNS["calibrate"]), RUNS["fitted"]
    assert cal.hidden_fraction == stored["hidden_fraction"]
    assert cal.copy_gbps == pytest.approx(stored["copy_gbps"], rel=1e-9)
    assert cal.per_copy_ms == pytest.approx(stored["per_copy_ms"], rel=1e-9)


@pytest.mark.parametrize("name", ["calibrate", "validate"])
@pytest.mark.parametrize("strategy", ["lru", "fixed", "tencache"])
def test_replayed_bytes_match_what_the_engine_moved(name: str, strategy: str) -> None:
    """The replay's bytes per step against the engine's measured bytes (within 5%)."""
    run = RUNS[name]
    moved = bench_traffic(run)[strategy].bytes_moved
    assert moved == pytest.approx(run[strategy]["bytes_moved_per_step"], rel=0.05)


DOCS = Path(__file__).parents[3] / "docs" / "results" / "data"
H100 = DOCS / "offload-h100"


@pytest.mark.parametrize(
    "name",
    ["offload-h100/small.json", "offload-h100/gpt_second_run.json", "offload-h200/small.json"],
)
@pytest.mark.parametrize("strategy", ["lru", "fixed", "tencache"])
def test_replayed_bytes_match_the_engine_on_a_gpu(name: str, strategy: str) -> None:
    """The two H100 runs and the H200 run (no recorded profile: the stored one, same
    model, with each run's budgets): the replay's bytes per step against what the
    engine moved there."""
    run = with_profile(json.loads((DOCS / name).read_text())["gpt"], RUNS["calibrate"])
    moved = bench_traffic(run)[strategy].bytes_moved
    assert moved == pytest.approx(run[strategy]["bytes_moved_per_step"], rel=0.05)


def test_borrowed_profile_only_for_the_same_model() -> None:
    run = json.loads((H100 / "small.json").read_text())["gpt"]
    other = {**run, "model": {**run["model"], "config": {**run["model"]["config"], "dim": 256}}}
    with pytest.raises(ValueError, match="not the stored"):
        with_profile(other, RUNS["calibrate"])
    # same width, depth and vocabulary, another architecture: its tensors differ
    bert = json.loads((DOCS / "offload-h200" / "small.json").read_text())["bert"]
    assert bert["model"]["config"] == run["model"]["config"]
    with pytest.raises(ValueError, match="bert"):
        with_profile(bert, RUNS["calibrate"])
    got = with_profile(run, RUNS["calibrate"])["profile"]
    assert got["order"] == RUNS["calibrate"]["profile"]["order"]
    assert (
        got["fast_budget_bytes"]
        == run["model"]["fast_budget_bytes"]
        != (RUNS["calibrate"]["profile"]["fast_budget_bytes"])
    )


def _profile(sizes: dict[str, int], order: list[str], fast: int, host: int) -> TensorProfile:
    tensors = [(t, n, "float32", "param") for t, n in sizes.items()]
    return TensorProfile("p", tensors, order, fast_budget_bytes=fast, host_budget_bytes=host)


def test_lru_replay_hand_solved() -> None:
    """4 KiB tensors; a small class keeps 4 buffers at least (the engine's in-use
    floor). a b c a: all stay, the second step moves nothing. a b c d e with a budget
    of those 4 buffers: LRU cycles, every access misses and evicts a tensor changed
    at its last access (written back): 5 reads + 5 writes, all on NVMe (no host)."""
    k = 4096
    p = _profile({"a": k, "b": k, "c": k}, ["a", "b", "c", "a"], 4 * k, 0)
    assert step_traffic(p, "lru", Budgets(4 * k, 0)) == Traffic(0, 0, 0, 4, 0, 0)
    p = _profile({t: k for t in "abcde"}, list("abcde"), 4 * k, 0)
    tr = step_traffic(p, "lru", Budgets(4 * k, 0))
    assert (tr.demand_misses, tr.demand_bytes, tr.nvme_bytes) == (5, 10 * k, 10 * k)
    # with host room for two, the first two in use order live there: their bytes leave NVMe
    tr = step_traffic(p, "lru", Budgets(4 * k, 2 * k))
    assert (tr.demand_bytes, tr.nvme_bytes) == (10 * k, 6 * k)


def test_step_cost_exact() -> None:
    tr = Traffic(ahead_bytes=2_000_000, demand_bytes=1_000_000, accesses=10, prefetches=4,
                 demand_misses=2)  # fmt: skip
    # 1 GB/s: 1 MB = 1 ms; +0.5 ms per copy: ahead 2 + 2, demand 1 + 1
    c = step_cost(tr, compute_ms=10.0, hidden_fraction=0.5, gbps=1.0, per_copy_ms=0.5)
    assert c.copy_ms == pytest.approx(6.0)
    assert c.unhidden_ms == pytest.approx(2.0 + 4.0 - 2.0)
    assert c.slowdown == pytest.approx(14.0 / 10.0)
    assert c.hit_rate == pytest.approx(1 - (2 + 4 * 0.5) / 10)
    # hiding never exceeds compute
    short = step_cost(tr, compute_ms=1.0, hidden_fraction=0.9, gbps=1.0, per_copy_ms=0.5)
    assert short.unhidden_ms == pytest.approx(6.0 - 1.0)
    # the NVMe stage binds when its share of the bytes is slower than PCIe
    nv = Traffic(ahead_bytes=3_000_000, nvme_bytes=3_000_000, accesses=1, prefetches=1)
    assert step_cost(nv, 10.0, 0.0, 16.0, 3.0).copy_ms == pytest.approx(1.0)
