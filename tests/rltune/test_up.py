"""`rltune up` / `rltune metrics`: the operator's view of the latest snapshots."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from rltune.up import FIGURES, Services, _Progress, view
from shared.config import BusSettings
from shared.messages import MetricsSnapshot


def _render(latest: dict[str, MetricsSnapshot]) -> list[str]:
    console = Console(width=200, record=True)
    console.print(view(latest, rounds_per_s=0.0))
    return console.export_text().splitlines()


def test_an_idle_profiler_says_where_profiles_come_from_and_a_busy_one_does_not() -> None:
    latest = {
        "profiler": MetricsSnapshot(source="profiler", counters={"consumed": 0, "published": 0}),
        "scoring": MetricsSnapshot(source="scoring", counters={"consumed": 7, "published": 7}),
    }
    lines = _render(latest)
    (prof,) = [ln for ln in lines if ln.lstrip().startswith("profiler")]
    (score,) = [ln for ln in lines if ln.lstrip().startswith("scoring")]
    assert "in 0  out 0" in prof and "no profiles yet" in prof
    assert "in 7  out 7" in score and "no profiles yet" not in score
    latest["profiler"] = MetricsSnapshot(source="profiler", counters={"consumed": 2})
    (prof,) = [ln for ln in _render(latest) if ln.lstrip().startswith("profiler")]
    assert "in 2" in prof and "no profiles yet" not in prof


def _progress(behind_s: float, speedup: float) -> _Progress:
    p = _Progress(total=10, speedup=speedup)
    p.replay_clock = 100_000.0
    p.seen(MetricsSnapshot(source=FIGURES, counters={"clock_s": 100_000.0 - behind_s}))
    return p


def test_the_lag_is_said_only_past_what_snapshot_age_explains() -> None:
    # at 1000x one second of snapshot age is 1000 s of trace: two of them are not a lag
    assert _progress(1_900.0, 1000.0).lag() == ""
    assert _progress(7_200.0, 1000.0).lag() == ", cluster clock 2.0 h behind the replay"
    # lockstep (speedup 0) and slow replays: anything past a minute is a lag
    assert _progress(59.0, 0.0).lag() == ""
    assert _progress(3_600.0, 0.0).lag() == ", cluster clock 1.0 h behind the replay"
    assert _progress(45.0, 10.0).lag() == ""
    assert _progress(1_800.0, 10.0).lag() == ", cluster clock 0.5 h behind the replay"


def _services(extra: list[str]) -> list[str]:
    import argparse

    from rltune.up import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    from rltune.up import SAMPLE

    args = parser.parse_args(["up", "--trace", str(SAMPLE), *extra])
    args.format, args.cluster, args.speedup = "jsonl", "c.yaml", 1000.0
    args.round_interval = 60.0 if args.round_interval is None else args.round_interval
    args.epoch = 1_700_000_000.25
    settings = BusSettings.resolve("127.0.0.1:1", "t-")
    return Services(settings, args, Path("/nonexistent")).argv["cluster-sim"]


def test_real_time_shares_the_replay_epoch_and_rounds_every_interval() -> None:
    argv = _services([])
    assert argv[argv.index("--epoch") + 1] == "1700000000.25"
    assert argv[argv.index("--round-interval") + 1] == "60.0"
    lock = _services(["--lockstep", "--round-interval", "0"])
    assert "--epoch" not in lock and "--round-interval" not in lock


def test_the_replay_declares_the_model_size_of_the_jobs_cluster_sim_marks() -> None:
    import argparse

    from rltune.up import CLUSTER, SAMPLE, register, replay_jobs
    from shared.cluster import load_cluster
    from shared.replay import job_spec_of
    from shared.sim import load_jobs
    from shared.sim.offload_jobs import mark_offloading
    from shared.traces import SkipStats

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["up", "--trace", str(SAMPLE), "--offload-fraction", "0.3", "--seed", "4", "--limit", "400"]
    )
    args.format = "jsonl"
    cluster = load_cluster(CLUSTER)
    got = replay_jobs(args, cluster, SkipStats())
    # cluster-sim's own marking (services/cluster_sim/service.py: serve)
    marked = mark_offloading(load_jobs(SAMPLE, "jsonl", cluster, SkipStats(), 400), 0.3, 4)
    want = {j.job_id: j.param_bytes for j in marked if j.param_bytes}
    assert 80 < len(want) < 160
    specs = [job_spec_of(j) for j in got]
    assert {s.job_id: s.offload.param_bytes for s in specs if s.offload is not None} == want
    plain = parser.parse_args(["up", "--trace", str(SAMPLE), "--limit", "400"])
    plain.format, plain.offload_fraction = "jsonl", 0.0
    assert all(job_spec_of(j).offload is None for j in replay_jobs(plain, cluster, SkipStats()))


def test_the_view_says_when_a_replay_is_over() -> None:
    p = _Progress(total=3, speedup=1000.0)
    assert p.head().startswith("replay 0/3 submitted, ")
    p.submitted, p.done_replay = 3, True
    busy = {"waiting": 0.0, "running": 1.0, "done": 2.0, "ahead": 0.0}
    p.seen(MetricsSnapshot(source=FIGURES, counters=busy))
    assert p.head().startswith("replay 3/3 submitted, ")  # one still runs
    p.seen(MetricsSnapshot(source=FIGURES, counters={**busy, "running": 0.0, "done": 3.0}))
    assert p.head().startswith("replay over: all 3 jobs ended, ")
    live = _Progress(total=0, live="local cluster, 2 host(s) x 4 GPU")
    assert live.head().startswith("local cluster, 2 host(s) x 4 GPU, up ")
    lines = _render({FIGURES: MetricsSnapshot(source=FIGURES, counters={"rounds": 5.0})})
    assert any("5 rounds  none in the last seconds" in ln for ln in lines)


def test_a_replays_reclaim_settings_reach_cluster_sim_parsed_as_given() -> None:
    from services.cluster_sim.service import add_args, from_args

    argv = _services(["--lockstep", "--grace", "60", "--min-run", "300", "--checkpoint", "900"])
    import argparse

    p = argparse.ArgumentParser()
    add_args(p)
    conf = from_args(p.parse_args(argv[argv.index("--trace") :]))
    assert (conf.reclaim, conf.grace_s, conf.min_run_s, conf.checkpoint_s) == (
        True, 60.0, 300.0, 900.0,
    )  # fmt: skip
    assert conf.sim_config().grace_s == 60.0 and conf.sim_config().checkpoint_s == 900.0
    off = _services(["--lockstep", "--no-reclaim"])
    assert from_args(p.parse_args(off[off.index("--trace") :])).sim_config().reclaim is False
    plain = _services(["--lockstep"])
    assert "--grace" not in plain and "--no-reclaim" not in plain
