"""The command line on traces with identity: an SWF log runs on the cluster its header
describes when no --cluster is given; any other format without --cluster is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltune import main
from tests.paths import ITP, KTH_SWF


def test_swf_without_cluster_uses_the_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.json"
    argv = ["simulate", "--trace", str(KTH_SWF), "--format", "swf", "--policy", "sjf-req"]
    assert main([*argv, "--limit", "200", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["jobs"] == 200 and not summary["rejected"]


def test_other_formats_need_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(ITP / "cluster05.csv"), "--format", "itp"]
    assert main([*argv, "--policy", "fifo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cluster is required" in err[0]


def test_submit_checks_the_time_limit_before_any_broker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["submit", "--job-id", "x", "--num-gpus", "1", "--project", "p", "--app", "a"]
    assert main([*argv, "--time-limit", "-5", "--bootstrap", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "time_limit_s" in err[0]
