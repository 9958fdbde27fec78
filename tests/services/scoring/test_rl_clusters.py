"""The clusters the learned policy is trained and evaluated on say what they are."""

from __future__ import annotations

import calendar
import csv
from datetime import datetime
from pathlib import Path

import pytest

from services.scoring.rl.env import capacity
from shared.cluster import load_cluster
from tests.paths import PHILLY

CLUSTERS = Path(__file__).resolve().parents[3] / "clusters"


def test_evaluation_cluster_is_loaded_095_by_the_philly_slice() -> None:
    """sum(gpu_time) / submission span of the jobs from 2017-10-15, over the cluster's
    capacity in P100s (speeds of shared.speeds), computed straight from the CSV."""
    cluster = load_cluster(CLUSTERS / "philly-hetero.yaml")
    assert len(cluster.gpu_types) >= 3 and cluster.total_gpus == 776
    since = calendar.timegm(datetime(2017, 10, 15).utctimetuple())
    times, gpu_time = [], 0.0
    with PHILLY.open() as f:
        for row in csv.DictReader(f):
            t = calendar.timegm(datetime.fromisoformat(row["timestamp"]).utctimetuple())
            if t >= since:
                times.append(t)
                gpu_time += float(row["gpu_time"])
    assert len(times) == 23_058
    load = gpu_time / (max(times) - min(times)) / capacity(cluster)
    assert load == pytest.approx(0.95, abs=0.005)


def test_evaluation_cluster_is_not_a_training_cluster() -> None:
    shape = {(n.gpu_type, n.gpus) for n in load_cluster(CLUSTERS / "philly-hetero.yaml").nodes}
    for path in sorted((CLUSTERS / "train").glob("*.yaml")):
        train = load_cluster(path)
        assert {(n.gpu_type, n.gpus) for n in train.nodes} != shape
        assert train.total_gpus < 776
