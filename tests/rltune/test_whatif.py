"""`rltune whatif`: variants applied to the cluster, queues, arrivals and scheduler,
checked against hand-written clusters and against `rltune simulate` run on them."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from rltune import main
from shared.cluster import ClusterSpec, load_cluster, parse_cluster
from shared.errors import UserError
from shared.sim.load import offered_load, span_load
from shared.whatif import Scenario, apply, parse_variant, scenario_jobs
from tests.paths import PHILLY

ROOT = Path(__file__).resolve().parents[2]
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
        # more than MAX_GPUS in the scenario's cluster (36 GPUs: 24 V100, 12 P100)
        ("nodes.V100=+200000", "would have 1,600,036 GPUs; at most 1,000,000"),
        ("nodes.V100=200000", "would have 1,600,012 GPUs; at most 1,000,000"),
        ("nodes.P100=x150000", "would have 1,800,024 GPUs; at most 1,000,000"),
        ("scale=50000", "would have 1,800,000 GPUs; at most 1,000,000"),
        ("nodes.A100=+125000x8", "would have 1,000,036 GPUs; at most 1,000,000"),
        ("nodes.A100=+1.5x8", "whole numbers of nodes and of GPUs per node"),
        ("nodes.A100=+2x0.5", "whole numbers of nodes and of GPUs per node"),
        # non-finite numbers, wherever a number goes
        ("speed.V100=nan", "--vary speed.V100=nan: 'nan' is not a finite number"),
        ("load=inf", "--vary load=inf: 'inf' is not a finite number"),
        ("window=inf", "'inf' is not a finite number"),
        ("scale=nan", "'nan' is not a finite number"),
        ("queue.nlp.limit=inf", "'inf' is not a finite number"),
        ("queue.nlp.weight=-inf", "'-inf' is not a finite number"),
        ("nodes.V100=xinf", "'inf' is not a finite number"),
        ("nodes.V100=+nan", "'nan' is not a finite number"),
        ("nodes.A100=+infx8", "'inf' is not a finite number"),
        # a speed of a type the scenario's cluster lacks would change nothing
        ("speed.A100=2", "the scenario's cluster has no A100 GPUs \\(types: P100, V100\\)"),
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
    inside = scenario_jobs(jobs, s, "span")  # as --load-basis span: the GPU-time in the span
    assert span_load(inside, s.cluster) == pytest.approx(0.9, rel=1e-6)
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
    assert [r["scenario"] for r in rows] == [s["scenario"] for s in got]
    assert "policy" not in rows[0] and float(rows[1]["avg_jct_s"]) == got[1]["summary"]["avg_jct_s"]
    assert (out / "gpu_util.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "jobs-1.csv").stat().st_size > 1000


def test_a_bad_variant_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["whatif", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(HETERO)]
    assert main([*argv, "--policy", "fifo", "--vary", "policy=nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown policy 'nope'" in err


def _two_types() -> ClusterSpec:
    """One 8-GPU P100 node (P100 the reference, speed 1) and one 8-GPU V100 (speed 2)."""
    return parse_cluster(
        {
            "reference": "P100",
            "speed": {"P100": 1.0, "V100": 2.0},
            "nodes": [
                {"name": "p", "count": 1, "gpu_type": "P100", "gpus": 8},
                {"name": "v", "count": 1, "gpu_type": "V100", "gpus": 8},
            ],
        }
    )


@pytest.mark.parametrize(
    ("variant", "speeds", "p100_s", "v100_s", "capacity_p100s"),
    [  # run time = 1000 s x 1.0 (the base's P100 speed) / the type's speed in the scenario
        (None, (1.0, 2.0), 1000.0, 500.0, 8 * 1.0 + 8 * 2.0),
        ("speed.P100=0.5", (0.5, 2.0), 2000.0, 500.0, 8 * 0.5 + 8 * 2.0),
        ("speed.P100=2", (2.0, 2.0), 500.0, 500.0, 8 * 2.0 + 8 * 2.0),
        ("speed.V100=4", (1.0, 4.0), 1000.0, 250.0, 8 * 1.0 + 8 * 4.0),
        ("speed.P100=0.5,speed.V100=1", (0.5, 1.0), 2000.0, 1000.0, 8 * 0.5 + 8 * 1.0),
    ],
)
def test_speeds_keep_durations_anchored_to_the_base_reference(
    variant: str | None,
    speeds: tuple[float, float],
    p100_s: float,
    v100_s: float,
    capacity_p100s: float,
) -> None:
    """Halving the reference type (P100) makes a P100 job twice as slow and leaves the
    V100 job alone (it used to do the opposite: the anchor moved with P100)."""
    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy
    from shared.sim import simulate
    from shared.sim.load import capacity
    from shared.traces import TraceJob

    s = _base(_two_types())
    if variant is not None:
        s = apply(s, parse_variant(variant))
    jobs = [
        TraceJob("on-p100", 0.0, 1000.0, 8, gpu_types=("P100",)),
        TraceJob("on-v100", 0.0, 1000.0, 8, gpu_types=("V100",)),
    ]
    result = simulate(jobs, s.cluster, make_policy("fifo"), make_placer("greedy"))
    run = {r.job_id: r.run_s for r in result.records}
    assert run == {"on-p100": pytest.approx(p100_s), "on-v100": pytest.approx(v100_s)}
    assert capacity(s.cluster) == pytest.approx(capacity_p100s)  # in base-P100s
    assert (s.cluster.speed["P100"], s.cluster.speed["V100"]) == speeds  # as given


def test_absurd_sizes_are_refused_before_any_node_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shared.whatif

    def refuse(*_: object) -> None:
        raise AssertionError("nodes built for an absurd cluster")

    monkeypatch.setattr(shared.whatif, "_new_nodes", refuse)  # (a hang before the fix)
    for text in ("nodes.V100=+1e9", "nodes.V100=1e9", "nodes.V100=x1e9", "scale=1e9"):
        with pytest.raises(UserError, match=re.escape(f"--vary {text}: the scenario's cluster")):
            apply(_base(_cluster()), parse_variant(text))
    with pytest.raises(UserError, match="would have 8,000,000,036 GPUs"):
        apply(_base(_cluster()), parse_variant("nodes.A100=+1e9x8"))


def test_a_changed_queue_must_exist_in_the_cluster_or_the_trace() -> None:
    """As drop-vc: a queue that is neither a queue of the cluster, `default`, nor a VC
    of the trace is refused, naming it and what exists."""
    from shared.sim import load_jobs
    from shared.traces import SkipStats

    jobs = load_jobs(PHILLY, "philly", load_cluster(HETERO), SkipStats(), 300)
    vcs = sorted({j.vc for j in jobs})
    base = _base(_cluster())  # one queue, nlp (no job of the trace is in VC nlp)
    with pytest.raises(UserError) as err:
        scenario_jobs(jobs, apply(base, parse_variant("queue.zzz.limit=10")))
    assert str(err.value) == (
        "--vary queue.zzz.limit=10: no queue or VC zzz in the cluster or the trace "
        f"(queues: default, nlp; VCs: {', '.join(vcs)})"
    )
    with pytest.raises(UserError, match=r"--vary queue\.zzz\.weight=2: no queue or VC zzz"):
        scenario_jobs(jobs, apply(base, parse_variant("queue.nlp.limit=4,queue.zzz.weight=2")))
    ok = f"queue.{vcs[0]}.limit=8,queue.default.limit=64,queue.nlp.weight=2"
    s = apply(base, parse_variant(ok))
    assert s.new_queues == {vcs[0], "default"}
    assert scenario_jobs(jobs, s) == jobs


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("nodes.V100=+1e9", "--vary nodes.V100=+1e9: the scenario's cluster would have"),
        ("speed.V100=nan", "--vary speed.V100=nan: 'nan' is not a finite number"),
        ("load=inf", "--vary load=inf: 'inf' is not a finite number"),
        ("queue.zzz.limit=10", "--vary queue.zzz.limit=10: no queue or VC zzz"),
    ],
)
def test_refused_variants_are_one_line_and_exit_2(
    text: str, why: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import shared.whatif

    def refuse(*_: object) -> None:
        raise AssertionError("nodes built for an absurd cluster")

    monkeypatch.setattr(shared.whatif, "_new_nodes", refuse)
    argv = ["whatif", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(HETERO)]
    argv += ["--limit", "200", "--placer", "greedy", "--policy", "fifo", "--vary", text]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and "Traceback" not in err


def test_base_load_compresses_once_and_every_scenario_replays_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--load 1.2`: the arrivals are compressed once, for the base's cluster; a smaller
    or slower scenario replays them, so its offered load is higher (it used to be
    compressed to 1.2 again), and its run is `simulate` of those arrivals."""
    from services.placement.registry import make_placer
    from services.scoring.policies import make_policy
    from shared.sim import SimConfig, load_jobs, simulate
    from shared.sim.load import compress_to_load
    from shared.traces import SkipStats

    argv = ["whatif", "--trace", str(PHILLY), "--format", "philly", "--cluster", str(HETERO)]
    argv += ["--limit", "1500", "--placer", "greedy", "--policy", "fifo", "--load", "1.2"]
    argv += ["--vary", "scale=0.8", "--vary", "speed.P100=0.5", "--vary", "load=0.9"]
    assert main([*argv, "--json", str(tmp_path / "w.json")]) == 0
    got = json.loads((tmp_path / "w.json").read_text())
    loads = [s["offered_load"] for s in got["scenarios"]]
    # capacity in P100s, by hand: 160 K80 x 0.3152 + 368 P100 + 248 V100 x 1.0605
    k80, p100, v100 = 160 * 0.3152, 368.0, 248 * 1.0605
    small = 128 * 0.3152 + (32 * 8 + 19 * 2) + 25 * 8 * 1.0605  # scale=0.8, the file
    assert loads == [
        pytest.approx(1.2),
        pytest.approx(1.2 * (k80 + p100 + v100) / small),
        pytest.approx(1.2 * (k80 + p100 + v100) / (k80 + 0.5 * p100 + v100)),
        pytest.approx(0.9),
    ]
    assert capsys.readouterr().err.count("submission gaps divided by") == 1  # (once)
    hetero = load_cluster(HETERO)
    jobs = load_jobs(PHILLY, "philly", hetero, SkipStats(), 1500)
    jobs, factor = compress_to_load(jobs, hetero, 1.2)
    assert got["settings"]["load_factor"] == factor
    placer, policy = make_placer("greedy", reproducible=True), make_policy("fifo")
    want = simulate(jobs, load_cluster(SMALL), policy, placer, SimConfig()).summary()
    for key in ("jobs", "avg_jct_s", "p99_queue_s", "avg_bsld", "gpu_util", "makespan_s"):
        assert got["scenarios"][1]["summary"][key] == want[key], key
