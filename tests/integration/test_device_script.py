"""scripts/device/agents-on-gpu.sh, as the GPU machine runs it, on this machine's
emulated GPUs (no NVIDIA driver here): `rltune up`, the inventory read back from
`cluster.nodes`, one job through `rltune submit --wait finished`, and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_the_device_script_reports_inventory_events_and_times(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = "import os, sys; print('gpus', os.environ['CUDA_VISIBLE_DEVICES']); sys.exit(0)"
    script = ROOT / "scripts" / "device" / "agents-on-gpu.sh"
    cmd = f'{sys.executable} -c "{code}"'
    env = {"OUT": str(out), "PYTHON": sys.executable, "RLTUNE_DEVICE_WHEELS": str(tmp_path)}
    run = subprocess.run(
        ["bash", str(script), "--num-gpus", "2", "--command", cmd],
        env={**os.environ, **env},  # (this checkout's venv: no wheels to install)
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,  # (the script finds the checkout from its own path)
    )
    assert run.returncode == 0, run.stdout + run.stderr + (out / "up.log").read_text()
    report = json.loads((out / "agents-on-gpu.json").read_text())
    # no GPU here: `rltune up`'s default local cluster, two hosts of four emulated GPUs
    inventory = sorted((n["node_id"], n["gpus"], n["source"]) for n in report["inventory"])
    assert inventory == [("host-0", 4, "inventory"), ("host-1", 4, "inventory")]
    assert [e["kind"] for e in report["events"]] == ["started", "finished"]
    (started, finished) = report["events"]
    assert finished["exit_code"] == 0 and started["node_ids"] == finished["node_ids"]
    (gpus,) = [line.split()[1] for line in report["job_stdout"] if line.startswith("gpus ")]
    assert len(gpus.split(",")) == 2  # the two GPUs it was given, as CUDA_VISIBLE_DEVICES
    assert report["submit"]["exit_code"] == 0 and report["up_exit_code"] == 0
    assert 0 < report["broker_ready_s"] <= report["first_node_status_s"]
    assert report["first_node_status_s"] <= report["submitted_s"] < report["up_to_end_s"]
    assert report["started_to_finished_s"] >= 0


def test_the_carried_wheels_are_the_locked_versions() -> None:
    """fetch-wheels.sh pins what requirements.lock pins (a bump of the lock must
    reach the GPU machine too)."""
    text = (ROOT / "scripts" / "device" / "fetch-wheels.sh").read_text()
    block = text.split("WHEELS=(", 1)[1].split(")", 1)[0]
    wheels = dict(w.lower().split("==") for w in block.split())
    lock = dict(
        line.strip().lower().split("==")
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert len(wheels) == 14
    for name, version in wheels.items():
        assert lock.get(name) == version, name
