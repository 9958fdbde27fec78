"""The Grafana dashboard has a row per team queue: a row repeated over the `queue`
variable (the queues telemetry reports), whose panels plot the per-queue metrics."""

from __future__ import annotations

import json
from pathlib import Path

DASH = Path(__file__).resolve().parents[2] / "compose" / "grafana" / "dashboards" / "rltune.json"


def test_a_row_repeats_per_queue_with_the_queue_metrics() -> None:
    dash = json.loads(DASH.read_text())
    (var,) = [v for v in dash["templating"]["list"] if v["name"] == "queue"]
    assert "label_values(rltune_queue_pending_jobs, queue)" in var["definition"]
    panels = dash["panels"]
    (i,) = [n for n, p in enumerate(panels) if p["type"] == "row" and p.get("repeat") == "queue"]
    below = panels[i + 1 :]  # a repeated row repeats the panels under it
    assert all(p["type"] != "row" for p in below)
    exprs = " ".join(t["expr"] for p in below for t in p["targets"])
    for name in (
        "rltune_queue_pending_jobs",
        "rltune_queue_allocated_gpus",
        "rltune_queue_borrowed_gpus",
        "rltune_preemptions_total",
        "rltune_queue_fair_share_factor",
    ):
        assert f'{name}{{queue="$queue"}}' in exprs, name
    assert all(p["gridPos"]["y"] == panels[i]["gridPos"]["y"] + 1 for p in below)
