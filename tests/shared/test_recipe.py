"""A run's recipe (shared/recipe.py): the jobs it selects on a trace written here, worked
out by hand; its checks as one line; and the simulator settings cluster-sim and
`rltune simulate` build from the same flags."""

from __future__ import annotations

import argparse
import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rltune.simulate import add_run_args, recipe_of
from services.cluster_sim.service import add_args, from_args
from shared.errors import UserError
from shared.recipe import RunRecipe, build_inputs, check_round_interval
from shared.traces import SkipStats

HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n"
# submit second (from 2017-10-01 00:00:00 UTC), duration s, GPUs
ROWS = [(0, 100.0, 1), (10, 50.0, 2), (30, 20.0, 1), (60, 40.0, 2), (100, 10.0, 1)]
T0 = datetime(2017, 10, 1, tzinfo=UTC).timestamp()


@pytest.fixture
def recipe(tmp_path: Path) -> RunRecipe:
    trace = tmp_path / "t.csv"
    trace.write_text(
        HEAD
        + "".join(
            f"2017-10-01 00:{s // 60:02d}:{s % 60:02d},{d},{g},{d * g},vc\n" for s, d, g in ROWS
        )
    )
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {name: n, gpu_type: P100, gpus: 4}\nreference: P100\n")
    return RunRecipe(trace=str(trace), format="philly", cluster=str(cluster))


def _submits(recipe: RunRecipe) -> list[float]:
    inputs = build_inputs(recipe, SkipStats(), say=lambda _: None)
    return [j.submit_s - T0 for j in inputs.jobs]


def test_limit_since_and_until_select_what_the_rows_say(recipe: RunRecipe) -> None:
    assert _submits(recipe) == [0, 10, 30, 60, 100]
    assert _submits(dataclasses.replace(recipe, limit=2)) == [0, 10]
    window = dataclasses.replace(recipe, since="2017-10-01 00:00:10", until="2017-10-01 00:01:00")
    assert _submits(window) == [10, 30]  # [since, until): 60 is out
    assert _submits(dataclasses.replace(window, limit=1)) == [10]


def test_repeat_replays_the_jobs_after_the_span(recipe: RunRecipe) -> None:
    """Copy k of n jobs spanning S starts k x S x n / (n - 1) later (shared/sim/load.py):
    here n = 2, S = 10, so the copy's two jobs come at 20 and 30."""
    two = dataclasses.replace(recipe, limit=2, repeat=2)
    inputs = build_inputs(two, SkipStats(), say=lambda _: None)
    assert [(j.job_id, j.submit_s - T0) for j in inputs.jobs] == [
        ("philly-1", 0),
        ("philly-2", 10),
        ("philly-1#1", 20),
        ("philly-2#1", 30),
    ]


def test_what_a_run_says_goes_to_say(recipe: RunRecipe) -> None:
    said: list[str] = []
    build_inputs(dataclasses.replace(recipe, limit=2, repeat=3), SkipStats(), said.append)
    assert said == ["--repeat 3: the 2 jobs replayed 3 times"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"window": 0}, "--window must be positive, got 0"),
        ({"round_interval_s": -1.0}, "--round-interval must be 0 or more seconds, got -1"),
        ({"round_interval_s": float("inf")}, "--round-interval must be 0 or more seconds"),
        ({"share_fraction": 1.5}, "--share-fraction must be within [0, 1], got 1.5"),
    ],
)
def test_bad_settings_are_one_line(recipe: RunRecipe, change: dict, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        dataclasses.replace(recipe, **change).sim_config()


def test_round_interval_zero_is_a_round_per_event() -> None:
    assert check_round_interval(0.0) == 0.0


def test_cluster_sim_and_simulate_give_the_simulator_the_same_settings() -> None:
    """The same flags to `rltune simulate` and to the cluster-sim service: one SimConfig."""
    flags = ["--trace", "t.csv", "--format", "philly", "--cluster", "c.yaml", "--seed", "7"]
    flags += ["--window", "32", "--discipline", "best-effort", "--round-interval", "60"]
    flags += ["--preempt", "--placer", "greedy", "--offload-fraction", "0.25"]
    simulate = argparse.ArgumentParser()
    add_run_args(simulate)
    service = argparse.ArgumentParser()
    add_args(service)
    mine = recipe_of(simulate.parse_args(flags))
    theirs = from_args(service.parse_args(flags)).recipe()
    assert mine.sim_config() == theirs.sim_config()
    assert mine.sim_config().window == 32 and theirs.sim_config().round_interval_s == 60.0
