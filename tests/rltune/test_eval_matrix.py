"""`rltune eval --matrix`: on two small cells of real traces (one with requested times,
one without), every policy's ratio to the cell's best heuristic equals what separate
`rltune simulate --json` runs give, worked out here; sjf-req is n/a where the trace has
no requested times; the geometric means are those of the ratios; a bad matrix file is
one line and exit 2."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from rltune import main
from tests.paths import ITP, THETAGPU

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ["fifo", "sjf-req", "smallest", "wfp3"]


def write_matrix(tmp_path: Path) -> Path:
    m = tmp_path / "m.yaml"
    m.write_text(
        f"- {{name: theta, trace: {THETAGPU}, format: alcf, cluster: "
        f"{ROOT / 'clusters' / 'thetagpu.yaml'}, fraction: [0.5, 1.0], limit: 150, load: 0.9}}\n"
        f"- {{name: itp, trace: {ITP / 'cluster05.csv'}, format: itp, cluster: "
        f"{ROOT / 'clusters' / 'itp-cluster05.yaml'}, limit: 120}}\n"
    )
    return m


def simulate_json(tmp_path: Path, cell: str, policy: str) -> dict[str, float]:
    """The same cell by `rltune simulate` (its own slicing flags), as JSON."""
    out = tmp_path / f"{cell}-{policy}.json"
    if cell == "theta":
        # fraction [0.5, 1.0]: from the second half's first submit time, 150 jobs
        argv = ["--trace", str(THETAGPU), "--format", "alcf", "--cluster",
                str(ROOT / "clusters" / "thetagpu.yaml"), "--since", THETA_SINCE,
                "--limit", "150", "--load", "0.9"]  # fmt: skip
    else:
        argv = ["--trace", str(ITP / "cluster05.csv"), "--format", "itp", "--cluster",
                str(ROOT / "clusters" / "itp-cluster05.yaml"), "--limit", "120"]  # fmt: skip
    assert main(["simulate", *argv, "--policy", policy, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def theta_since() -> str:
    """The submit time of the first job of the second half of ThetaGPU by submit order
    (the slice's start), read from the file with the csv module."""
    with THETAGPU.open() as fh:
        subs = sorted(float(r["submit_time"]) for r in csv.DictReader(fh))
    return repr(subs[round(0.5 * len(subs))])


THETA_SINCE = theta_since()


def test_matrix_ratios_match_separate_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["eval", "--matrix", str(write_matrix(tmp_path)), "--out", str(out)]
    assert main([*argv, "--policies", ",".join(POLICIES)]) == 0
    rows = list(csv.DictReader((out / "matrix.csv").open()))
    assert (out / "matrix.png").stat().st_size > 1000
    got = {(r["cell"], r["policy"]): r for r in rows}
    geo: dict[str, list[float]] = {}
    for cell in ("theta", "itp"):
        ran = {p: simulate_json(tmp_path, cell, p) for p in POLICIES if
               not (cell == "itp" and p == "sjf-req")}  # fmt: skip
        best = min(ran, key=lambda p: ran[p]["avg_bsld"])
        for p in POLICIES:
            r = got[(cell, p)]
            if p not in ran:
                assert r["bsld_ratio"] == "" and r["avg_bsld"] == ""  # n/a: no requests
                continue
            assert r["best_heuristic"] == best
            ratio = ran[p]["avg_bsld"] / ran[best]["avg_bsld"]
            assert float(r["bsld_ratio"]) == pytest.approx(ratio, rel=1e-12)
            jct = ran[p]["avg_jct_s"] / ran[best]["avg_jct_s"]
            assert float(r["jct_ratio"]) == pytest.approx(jct, rel=1e-12)
            geo.setdefault(p, []).append(ratio)
    md = (out / "matrix.md").read_text()
    for p, ratios in geo.items():
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        assert f"| {p} | {len(ratios)} | {g:.3f} |" in md
    assert "| itp |" in md and "n/a" in md


def test_bad_matrix_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "m.yaml"
    m.write_text("- {name: a, trace: x.csv, format: itp, fraction: [0.9, 0.1]}\n")
    assert main(["eval", "--matrix", str(m), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fraction" in err[0]
    m.write_text("- {name: a, trace: x.csv, format: itp, colour: red}\n")
    assert main(["eval", "--matrix", str(m), "--out", str(tmp_path / "o")]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err
    assert main(["eval", "--out", str(tmp_path / "o")]) == 2  # neither --matrix nor --trace
    assert "--trace is required" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "bench" / "matrices").glob("*.yaml")))
def test_the_shipped_matrix_files_load(path: Path) -> None:
    """Every matrix file the docs run loads, names a trace that is there, and no two of
    its cells measure the same slice."""
    from rltune.matrix import load_matrix

    cells = load_matrix(path)
    assert cells
    for c in cells:
        assert c.trace.is_file(), c.name
        assert c.cluster is None or c.cluster.is_file(), c.name
    slices = [(c.trace, c.since, c.until, c.fraction, c.limit, c.load) for c in cells]
    assert len(set(slices)) == len(slices)
