"""`rltune bench identity_ceiling`: its oracles checked against the project's own
`f1-oracle` and `sjf-oracle` (a class of one job is the job; no noise is the truth),
class means worked by hand, and the command on a small ThetaGPU cell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.identity_ceiling import F1Class, F1Noise, SjfClass, class_means, main
from services.placement.greedy import GreedyPlacer
from services.scoring.policies import make_policy
from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.policy_api import Policy
from shared.sim import SimConfig, simulate
from shared.traces import TraceJob
from tests.paths import THETAGPU

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = parse_cluster({"nodes": [{"name": "n", "count": 2, "gpu_type": "A100", "gpus": 4}]})


def jobs() -> list[TraceJob]:
    out = []
    for i in range(60):
        out.append(
            TraceJob(
                f"j{i}", float(i * 40), float(30 + (i * 97) % 900), 1 + (i * 7) % 4,
                user=f"u{i % 3}", app=f"a{i % 2}", time_limit_s=float(600 * (1 + i % 3)),
            )
        )  # fmt: skip
    return out


def starts(policy: Policy) -> list[tuple[str, float]]:
    r = simulate(jobs(), CLUSTER, policy, GreedyPlacer(), SimConfig(window=16))
    return [(rec.job_id, rec.segments[0].start_s) for rec in r.records]


def test_a_class_of_one_job_and_no_noise_are_the_per_job_oracles() -> None:
    one = class_means(jobs(), "job")
    assert starts(F1Class("job", one)) == starts(make_policy("f1-oracle"))
    assert starts(SjfClass("job", one)) == starts(make_policy("sjf-oracle"))
    assert starts(F1Noise(0.0)) == starts(make_policy("f1-oracle"))
    # and they are schedules that differ from each other (the comparison can fail)
    assert starts(make_policy("f1-oracle")) != starts(make_policy("sjf-oracle"))
    assert starts(F1Noise(1.0)) != starts(make_policy("f1-oracle"))


def test_class_means_by_hand() -> None:
    js = [
        TraceJob("a", 0, 100, 1, user="u", time_limit_s=60.0),
        TraceJob("b", 1, 300, 1, user="u", time_limit_s=60.0),
        TraceJob("c", 2, 50, 1, user="u", time_limit_s=120.0),
        TraceJob("d", 3, 10, 1, user="v"),
    ]
    assert class_means(js, "user") == {("u",): 150.0, ("v",): 10.0}
    by_request = {("u", 60.0): 200.0, ("u", 120.0): 50.0, ("v", None): 10.0}
    assert class_means(js, "user+req") == by_request
    assert all(p.oracle for p in (F1Noise(0.5), F1Class("user", {}), SjfClass("user", {})))


def test_the_command_on_a_small_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "m.yaml"
    m.write_text(
        f"- {{name: theta, trace: {THETAGPU}, format: alcf, cluster: "
        f"{ROOT / 'clusters' / 'thetagpu.yaml'}, fraction: [0.5, 1.0], limit: 120, load: 0.9}}\n"
    )
    argv = ["--matrix", str(m), "--sigmas", "0.5", "--classes", "user", "--placer", "greedy"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 0
    got = json.loads((tmp_path / "o" / "ceiling.json").read_text())
    row = got["cells"]["theta"]
    assert min(v for k, v in row.items() if k.startswith("heuristic:")) == 1.0
    oracles = {"f1-oracle", "sjf-oracle", "f1-noise:0.5", "f1-class:user", "sjf-class:user"}
    assert oracles <= set(row)
    assert (tmp_path / "o" / "ceiling.png").stat().st_size > 0
    assert "| f1-class:user |" in capsys.readouterr().out
    with pytest.raises(UserError, match="--classes"):
        main(["--matrix", str(m), "--classes", "group"])
