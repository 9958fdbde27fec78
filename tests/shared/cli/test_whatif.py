"""`rltune whatif`: variants applied to the cluster, queues, arrivals and scheduler,
checked against hand-written clusters and against `rltune simulate` run on them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from shared.cli import main
from shared.cluster import ClusterSpec, load_cluster, parse_cluster
from shared.errors import UserError
from shared.sim.load import offered_load
from shared.whatif import Scenario, apply, parse_variant, scenario_jobs
from tests.paths import PHILLY

ROOT = Path(__file__).resolve().parents[3]
HETERO = ROOT / "clusters" / "philly-hetero.yaml"
SMALL = ROOT / "clusters" / "philly-hetero-small.yaml"  # every node group x 0.8, by hand


def _cluster() -> ClusterSpec:
    return parse_cluster(
        {
            "nodes": [
                {"name": "v", "count": 3, "gpu_type": "V100", "gpus": 8},
                {"name": "p", "count": 2, "gpu_type": "P100", "gpus": 4},
                {"name": "q", "count": 2, "gpu_type": "P100", "gpus": 2},
            ],
            "queues": {"nlp": {"guaranteed_gpus": 8, "limit_gpus": 16}},
        }
    )


def _base(cluster: ClusterSpec) -> Scenario:
    return Scenario(cluster, "fifo", "greedy")


def _ids(s: Scenario) -> list[str]:
    return [n.node_id for n in s.cluster.nodes]


def test_scale_is_the_hand_written_smaller_cluster() -> None:
    s = apply(_base(load_cluster(HETERO)), parse_variant("scale=0.8"))
    assert s.cluster.nodes == load_cluster(SMALL).nodes  # same nodes, names and order
    assert s.label == "scale=0.8" and s.cluster.total_gpus == 622


def test_node_changes_by_type() -> None:
    base = _base(_cluster())
    s = apply(base, parse_variant("nodes.V100=+2"))
    assert _ids(s)[:5] == ["v-0", "v-1", "v-2", "v-0-whatif-0", "v-0-whatif-1"]
    assert _ids(s)[5:] == ["p-0", "p-1", "q-0", "q-1"]
    assert s.cluster.gpus_by_type() == {"V100": 40, "P100": 12}
    s = apply(base, parse_variant("nodes.V100=-1"))
    assert _ids(s) == ["v-0", "v-1", "p-0", "p-1", "q-0", "q-1"]
    s = apply(base, parse_variant("nodes.P100=2"))  # 4 nodes of two shapes -> 1 + 1
    assert _ids(s) == ["v-0", "v-1", "v-2", "p-0", "q-0"]
    s = apply(base, parse_variant("nodes.P100=x1.5"))
    assert _ids(s)[3:] == ["p-0", "p-1", "p-0-whatif-0", "q-0", "q-1", "q-0-whatif-0"]
    s = apply(base, parse_variant("nodes.A100=+2x4,speed.A100=2.5"))
    assert s.cluster.gpus_by_type()["A100"] == 8 and s.cluster.speed["A100"] == 2.5
    assert _ids(s)[-2:] == ["a100-whatif-0", "a100-whatif-1"]


def test_queue_and_scheduler_changes() -> None:
    base = _base(_cluster())
    s = apply(base, parse_variant("queue.nlp.limit=none, queue.cv.weight=2,policy=drf"))
    assert s.cluster.queues["nlp"].limit_gpus is None
    assert s.cluster.queues["nlp"].guaranteed_gpus == 8  # the rest kept
    assert s.cluster.queues["cv"].weight == 2.0 and s.policy == "drf"
    s = apply(base, parse_variant("discipline=strict,window=16,placer=milp,load=1.1"))
    assert (s.discipline, s.window, s.placer, s.load) == ("strict", 16, "milp", 1.1)
    assert base.cluster.queues["nlp"].limit_gpus == 16  # the base is never changed


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("scale", "is not KEY=VALUE"),
        ("foo=1", "unknown key 'foo'"),
        ("nodes.V100=-9", "only 3 V100 nodes"),
        ("nodes.A100=+1", "no A100 nodes to copy"),
        ("nodes.V100=1.5", "a whole number"),
        ("discipline=fair", "give one of strict, best-effort, easy"),
        ("window=0", "positive"),
        ("window=1.5", "a whole number"),
        ("speed.V100=fast", "is not a number"),
        ("nodes.V100=0,nodes.P100=0", "no GPUs"),
    ],
)
def test_bad_variants_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(UserError, match=why):
        apply(_base(_cluster()), parse_variant(text))


def test_scenario_jobs_drop_vcs_and_compress_to_the_scenario_load() -> None:
    from shared.sim import load_jobs
    from shared.traces import SkipStats

    cluster = load_cluster(HETERO)
    jobs = load_jobs(PHILLY, "philly", cluster, SkipStats(), 3000)
    vc = jobs[0].vc
    s = apply(_base(cluster), parse_variant(f"drop-vc={vc},scale=0.5,load=0.9"))
    out = scenario_jobs(jobs, s)
    assert [j.job_id for j in out] == [j.job_id for j in jobs if j.vc != vc]
    assert offered_load(out, s.cluster) == pytest.approx(0.9, rel=1e-9)  # of the half cluster
    with pytest.raises(UserError, match="no job of VC nope"):
        scenario_jobs(jobs, apply(_base(cluster), parse_variant("drop-vc=nope")))


def test_whatif_runs_equal_simulate_on_the_changed_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each scenario's summary is what `rltune simulate` gives on the hand-written
    equivalent: the smaller cluster file, the other discipline."""
    run = ["--trace", str(PHILLY), "--format", "philly", "--limit", "1500", "--placer", "greedy"]
    out = tmp_path / "w"
    argv = ["whatif", *run, "--cluster", str(HETERO), "--policy", "fifo"]
    argv += ["--vary", "scale=0.8", "--vary", "discipline=strict,policy=drf"]
    assert main([*argv, "--json", str(tmp_path / "w.json"), "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| scale=0.8 | 622 |" in table and "| discipline=strict, policy=drf | 776 |" in table
    got = json.loads((tmp_path / "w.json").read_text())["scenarios"]
    assert [s["scenario"] for s in got] == ["base", "scale=0.8", "discipline=strict, policy=drf"]
    refs = [
        [*run, "--cluster", str(HETERO), "--policy", "fifo"],
        [*run, "--cluster", str(SMALL), "--policy", "fifo"],
        [*run, "--cluster", str(HETERO), "--policy", "drf", "--discipline", "strict"],
    ]
    for i, (ref, scen) in enumerate(zip(refs, got, strict=True)):
        assert main(["simulate", *ref, "--json", str(tmp_path / f"{i}.json")]) == 0
        want = json.loads((tmp_path / f"{i}.json").read_text())
        for key in ("jobs", "avg_jct_s", "p99_queue_s", "avg_bsld", "gpu_util", "makespan_s"):
            assert scen["summary"][key] == want[key], (i, key)
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["policy"] for r in rows] == [s["scenario"] for s in got]
    assert (out / "gpu_util.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "jobs-1.csv").stat().st_size > 1000


def test_a_bad_variant_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(HETERO)]
    assert main([*argv, "--policy", "fifo", "--vary", "policy=nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown policy 'nope'" in err
