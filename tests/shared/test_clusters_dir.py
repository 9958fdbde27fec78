"""The cluster specs shipped in `clusters/` load, with the sizes their comments state."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from shared.cluster import load_cluster, parse_cluster
from shared.errors import UserError
from shared.speeds import DEFAULT_SPEEDS

ROOT = Path(__file__).resolve().parents[2] / "clusters"


def test_shipped_cluster_specs_load() -> None:
    philly = load_cluster(ROOT / "philly.yaml")
    assert philly.total_gpus == 640 and philly.reference == "P100"
    assert philly.gpus_by_type() == {"P100": 448, "V100": 192}
    example = load_cluster(ROOT / "example.yaml")
    assert example.speed["P100"] == 0.55 and example.queues["nlp"].limit_gpus == 64


def test_rltune_clusters_have_the_sizes_of_rltunes_code() -> None:
    alibaba = load_cluster(ROOT / "rltune-alibaba.yaml")
    assert alibaba.gpus_by_type() == {
        "T4": 8 * 2, "MISC": 8 * 8, "P100": 15 * 2, "V100_16GB": 10 * 8, "V100_32GB": 8 * 8
    }  # fmt: skip
    assert load_cluster(ROOT / "rltune-philly.yaml").gpus_by_type() == {"P100": 16 * 2 + 20 * 8}
    helios = load_cluster(ROOT / "rltune-helios.yaml")
    assert helios.gpus_by_type() == {"V100": (6 + 4 + 3 + 2 + 2) * 8}
    assert [helios.queues[str(vc)].limit_gpus for vc in range(5)] == [48, 32, 24, 16, 16]


def test_rltune_synthetic_trace_runs_on_its_cluster_and_sjf_is_fifo_there() -> None:
    """Every job of RLTune's synthetic trace runs on rltune-alibaba.yaml; its run times
    never decrease with submit time, so SJF with oracle run times orders the queue as
    FIFO does and gives the same schedule."""
    from services.placement.greedy import GreedyPlacer
    from services.scoring.policies import make_policy
    from shared.sim import SimConfig, load_jobs, simulate
    from shared.traces import SkipStats
    from tests.paths import RLTUNE_TRACE

    cluster = load_cluster(ROOT / "rltune-alibaba.yaml")
    jobs = load_jobs(RLTUNE_TRACE, "rltune", cluster, SkipStats())
    runs = [j.duration_s for j in jobs]
    assert all(a <= b for a, b in pairwise(runs))  # type: ignore[operator]
    fifo = simulate(jobs, cluster, make_policy("fifo"), GreedyPlacer(), SimConfig())
    sjf = simulate(jobs, cluster, make_policy("sjf-oracle"), GreedyPlacer(), SimConfig())
    assert fifo.rejected == {} and len(fifo.records) == len(jobs) == 960
    assert sjf.records == fifo.records


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("nodes: [\n", "line 2, column 1: expected the node content"),
        ("a: [1, 2\nb: 3\n", "line 2, column 2: expected ',' or ']'"),
    ],
)
def test_a_cluster_file_that_is_not_yaml_is_one_line_naming_where(
    tmp_path: Path, text: str, where: str
) -> None:
    """PyYAML's own message spans lines (a caret under the character); the user gets
    one line with the file, the line and column, and the problem."""
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(UserError) as err:
        load_cluster(p)
    assert str(err.value).startswith(f"cluster file {p} is not valid YAML: {where}")
    assert "\n" not in str(err.value)


def _spec(**top: object) -> dict[str, object]:
    nodes = [
        {"name": "a", "gpu_type": "V100", "gpus": 4},
        {"name": "b", "gpu_type": "T4", "gpus": 4},
    ]
    return {"nodes": nodes, **top}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        # a typo is not ignored (it would silently change the run)
        (_spec(speeds={"T4": 0.5}), "unknown key 'speeds'; the keys are name, nodes, speed,"),
        (
            {"nodes": [{"name": "a", "gpu_type": "V100", "gpu": 4}]},
            "nodes[0]: unknown key 'gpu'; the keys are name, gpu_type, count, gpus,",
        ),
        (
            _spec(queues={"x": {"limit": 4}}),
            "queues.x: unknown key 'limit'; the keys are guaranteed_gpus, limit_gpus, weight",
        ),
        (
            _spec(queues={"x": {"guaranteed_gpus": 64, "limit_gpus": 8}}),
            "queues.x: guaranteed_gpus 64 is more than limit_gpus 8",
        ),
        # a type of unknown speed would run as fast as a P100
        (
            {
                "nodes": [
                    {"name": "a", "gpu_type": "H100", "gpus": 8},
                    {"name": "b", "gpu_type": "A100", "gpus": 8},
                ]
            },
            "no speed known for GPU type H100: give it under `speed:`",
        ),
        (_spec(reference="H100"), "no speed known for GPU type H100"),
        (_spec(speed={"T4": float("nan")}), "speed.T4 must be a positive number, got nan"),
        (_spec(speed={"T4": float("inf")}), "speed.T4 must be a positive number, got inf"),
    ],
)
def test_cluster_spec_mistakes_are_named(spec: dict[str, object], message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_cluster(spec, "c.yaml")
    assert message in str(err.value)


def test_speeds_under_any_spelling_and_a_lone_type_needs_none() -> None:
    spec = parse_cluster(
        {"nodes": [{"name": "a", "gpu_type": "t4", "gpus": 1},
                   {"name": "b", "gpu_type": "Tesla-V100", "gpus": 1}]}
    )  # fmt: skip
    assert dict(spec.speed) == {"t4": DEFAULT_SPEEDS["T4"], "Tesla-V100": DEFAULT_SPEEDS["V100"]}
    # one type and no reference: every job runs on it at its traced duration
    lone = parse_cluster({"nodes": [{"name": "a", "gpu_type": "H100", "gpus": 8}]})
    assert lone.gpu_types == ("H100",)
    given = parse_cluster(_spec(speed={"H100": 3.0}, reference="H100"))
    assert given.reference == "H100"
