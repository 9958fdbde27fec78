"""The cluster specs shipped in `clusters/` load, with the sizes their comments state."""

from __future__ import annotations

from pathlib import Path

from shared.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[2] / "clusters"


def test_shipped_cluster_specs_load() -> None:
    philly = load_cluster(ROOT / "philly.yaml")
    assert philly.total_gpus == 640 and philly.reference == "P100"
    assert philly.gpus_by_type() == {"P100": 448, "V100": 192}
    example = load_cluster(ROOT / "example.yaml")
    assert example.speed["P100"] == 0.55 and example.queues["nlp"].limit_gpus == 64
