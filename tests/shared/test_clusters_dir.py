"""The cluster specs shipped in `clusters/` load, with the sizes their comments state."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from shared.cluster import load_cluster
from shared.errors import UserError

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
