"""`rltune simulate` from the command line: the JSON contract and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltune import main
from shared.metrics import SUMMARY_KEYS
from tests.paths import RLTUNE_TRACE

ROOT = Path(__file__).resolve().parents[2]
PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    trace = tmp_path / "t.csv"
    trace.write_text(
        PHILLY_HEAD
        + "2017-10-01 00:00:00,100.0,1,100.0,a\n"
        + "2017-10-01 00:00:10,50.0,2,100.0,b\n"
        + "this,is,not,a,row\n"
        + "2017-10-01 00:00:20,10.0,0,0.0,b\n"
    )
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {name: n, gpu_type: P100, gpus: 2}\nreference: P100\n")
    return {"trace": trace, "cluster": cluster, "dir": tmp_path}


def sim(files: dict[str, Path], *extra: str, trace: Path | None = None) -> list[str]:
    return [
        "simulate", "--trace", str(trace or files["trace"]), "--format", "philly",
        "--cluster", str(files["cluster"]), "--policy", "fifo", *extra,
    ]  # fmt: skip


def test_json_to_stdout_has_exactly_the_metric_keys(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(sim(files, "--json", "-")) == 0
    out, err = capsys.readouterr()
    s = json.loads(out)
    assert list(s) == [*SUMMARY_KEYS, "settings"]  # the metric keys, then the run's settings
    assert s["jobs"] == 2 and s["avg_jct_s"] == (100 + 140) / 2  # b waits for a: 10..100
    assert s["settings"]["policy"] == "fifo" and s["settings"]["placer"] == "milp"
    assert s["settings"]["repeat"] == 1 and s["settings"]["load"] is None
    assert "1 bad row" in err and "1 zero GPUs" in err


def test_limit_takes_the_first_jobs_by_submit(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = files["dir"] / "jobs.csv"
    assert main(sim(files, "--limit", "1", "--jobs-out", str(out))) == 0
    assert out.read_text().splitlines()[1].startswith("philly-1,a,")
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trace": "missing.csv"}, "trace file not found"),
        ({"format": "phily"}, "unknown trace format 'phily'"),
        ({"policy": "best"}, "unknown policy 'best'"),
        ({"placer": "magic"}, "unknown placer 'magic'"),
        ({"cluster": "nogpu.yaml"}, "the cluster has no GPUs"),
        ({"cluster": "missing.yaml"}, "cluster file not found"),
        ({"trace": "garbage.csv"}, "no usable job in the trace (2 bad row)"),
        ({"trace": "binary.csv"}, "not a Philly CSV"),
        ({"limit": "0"}, "--limit must be a positive number"),
        ({"json": "/no/such/dir/out.json"}, "cannot write /no/such/dir/out.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], change: dict, message: str
) -> None:
    d = files["dir"]
    (d / "nogpu.yaml").write_text("nodes:\n  - {name: n, gpu_type: P100, gpus: 0}\n")
    (d / "garbage.csv").write_text(PHILLY_HEAD + "x,y,z,w,v\n\x00\x01,2\n")
    (d / "binary.csv").write_bytes(b"\xff\xfe\x00garbage\x00" * 50)
    args = {"trace": files["trace"], "format": "philly", "cluster": files["cluster"]}
    args.update({"policy": "fifo"})
    args.update({k: (d / v if k in ("trace", "cluster") else v) for k, v in change.items()})
    argv = ["simulate"] + [x for k, v in args.items() for x in (f"--{k}", str(v))]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_flag_through_the_real_entry_point(files: dict[str, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rltune", "simulate", "--trace", str(files["trace"])],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "required" in done.stderr and "Traceback" not in done.stderr


def test_reference_flag_rescales_run_times(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Durations measured on K80 run 1/0.3152 = 3.17x faster on the cluster's P100s."""
    out = files["dir"] / "jobs.csv"
    assert main(sim(files, "--limit", "1", "--reference", "K80", "--jobs-out", str(out))) == 0
    start, finish = (float(x) for x in out.read_text().splitlines()[1].split(",")[3:5])
    assert finish - start == pytest.approx(100.0 * 0.3152)
    assert main(sim(files, "--reference", "TPU")) == 2
    assert "no speed known" in capsys.readouterr().err


def test_identical_bytes_across_processes_and_hash_seeds(tmp_path: Path) -> None:
    """No order in the simulator depends on string hashing: two processes with different
    PYTHONHASHSEED give the same --jobs-out on a trace with GPU type constraints."""
    import os

    trace = RLTUNE_TRACE
    cluster = tmp_path / "mixed.yaml"
    cluster.write_text(
        "nodes:\n"
        "  - {name: t4, count: 2, gpu_type: T4, gpus: 4}\n"
        "  - {name: v32, count: 2, gpu_type: V100M32, gpus: 8}\n"
        "  - {name: v16, gpu_type: V100M16, gpus: 8}\n"
        "  - {name: p100, count: 2, gpu_type: P100, gpus: 4}\n"
        "  - {name: misc, gpu_type: MISC, gpus: 8}\n"
    )
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"jobs-{seed}.csv"
        argv = ["simulate", "--trace", str(trace), "--format", "rltune", "--cluster", str(cluster)]
        argv += ["--policy", "drf", "--seed", "3", "--jobs-out", str(out), "--placer", "greedy"]
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-m", "rltune", *argv], cwd=ROOT, env=env)
        assert done.returncode == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and len(outs[0]) > 10_000


def test_nothing_finished_is_null_in_json_and_exits_1(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    big = files["dir"] / "big.csv"
    big.write_text(PHILLY_HEAD + "2017-10-01 00:00:00,100.0,4,400.0,a\n")
    assert main(sim(files, "--json", "-", trace=big)) == 1
    out, err = capsys.readouterr()
    s = json.loads(out)
    assert s["jobs"] == 0 and s["avg_jct_s"] is None
    assert s["rejected"] == {"more GPUs than the cluster has": 1}
    assert "no job finished out of 1 (1 more GPUs than the cluster has)" in err


def test_no_such_gpu_type_names_the_types_asked_for_and_those_there(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    trace = files["dir"] / "typed.jsonl"
    rows = [
        '{"job_id": "a", "num_gpus": 1, "duration_s": 5, "gpu_types": ["T4"]}',
        '{"job_id": "b", "num_gpus": 1, "duration_s": 5, "gpu_types": ["A100", "T4"]}',
        '{"job_id": "c", "num_gpus": 1, "duration_s": 5, "gpu_types": ["T4"]}',
        '{"job_id": "d", "num_gpus": 1, "duration_s": 5, "gpu_types": ["P100", "T4"]}',
    ]
    trace.write_text("\n".join(rows) + "\n")
    argv = sim(files, trace=trace)
    argv[argv.index("philly")] = "jsonl"
    assert main(argv) == 0
    err = capsys.readouterr().err
    # d can run on the P100 node; a, b, c cannot: T4 asked by three, A100 by one
    assert "error: fifo: no job finished" not in err
    assert (
        "warning: fifo: 3 of 4 jobs rejected (3 GPU type not in cluster; "
        "jobs ask for T4, A100, the cluster has P100)"
    ) in err


def test_more_than_half_rejected_is_a_warning(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    trace = files["dir"] / "mostly-big.csv"
    rows = ["2017-10-01 00:00:00,100.0,1,100.0,a"] + [
        f"2017-10-01 00:00:0{i},100.0,4,400.0,a" for i in range(1, 3)
    ]
    trace.write_text(PHILLY_HEAD + "\n".join(rows) + "\n")
    assert main(sim(files, "--json", "-", trace=trace)) == 0
    err = capsys.readouterr().err
    assert "warning: fifo: 2 of 3 jobs rejected (2 more GPUs than the cluster has)" in err


@pytest.mark.parametrize("discipline", ["strict", "best-effort", "easy"])
def test_discipline_is_in_the_summary(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], discipline: str
) -> None:
    assert main(sim(files, "--json", "-", "--discipline", discipline)) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["discipline"] == discipline and s["priority_inversions"] == 0


def test_unknown_discipline_is_exit_2(files: dict[str, Path]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(sim(files, "--discipline", "fcfs"))
    assert exc.value.code == 2


def test_one_submit_instant_prints_no_bare_zero_utilisation(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two 1-GPU jobs of 100 s and 50 s, both at t=0, on 2 GPUs: the submission span is
    empty (the summary keeps 0.0 by definition) and the makespan is 100 s, so GPUs were
    held 150 of 200 GPU-seconds: 0.750 over the makespan."""
    trace = files["dir"] / "batch.jsonl"
    trace.write_text(
        '{"job_id": "a", "num_gpus": 1, "duration_s": 100}\n'
        '{"job_id": "b", "num_gpus": 1, "duration_s": 50}\n'
    )
    argv = sim(files, "--json", "-", trace=trace)
    argv[argv.index("philly")] = "jsonl"
    assert main(argv) == 0
    out, err = capsys.readouterr()
    s = json.loads(out)
    assert (s["gpu_util"], s["gpu_util_makespan"]) == (0.0, 0.75)
    assert "GPU util n/a over the submission span" in err and "0.750 over the makespan" in err
    assert "GPU util 0.000" not in err


def test_jobs_out_to_stdout_and_one_place_for_two_files(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace", str(files["trace"]), "--format", "philly"]
    argv += ["--cluster", str(files["cluster"]), "--policy", "fifo", "--placer", "greedy"]
    assert main([*argv, "--jobs-out", "-"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("job_id,vc,submit_s,start_s,finish_s") and len(out) > 1
    assert not Path("-").exists()
    assert main([*argv, "--json", "-", "--jobs-out", "-"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rltune simulate: --json and --jobs-out both write to stdout: give two places"]


def test_summary_json_is_strict_json(files: dict[str, Path]) -> None:
    """No 16+ GPU job here: that size bucket's averages are null, not NaN (which
    strict JSON parsers refuse)."""
    import json

    out = files["dir"] / "s.json"
    argv = ["simulate", "--trace", str(files["trace"]), "--format", "philly", "--json", str(out)]
    assert main([*argv, "--cluster", str(files["cluster"]), "--policy", "fifo"]) == 0

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in the summary JSON")

    summary = json.loads(out.read_text(), parse_constant=refuse)
    assert summary["queue_by_size"]["16+"] == {"avg_s": None, "max_s": None, "jobs": 0}


def test_a_cluster_of_mixed_speeds_without_a_reference_says_what_durations_mean(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    mixed = files["dir"] / "mixed.yaml"
    mixed.write_text(
        "nodes:\n  - {name: a, gpu_type: P100, gpus: 2}\n  - {name: b, gpu_type: V100, gpus: 2}\n"
    )
    argv = ["simulate", "--trace", str(files["trace"]), "--format", "philly", "--policy", "fifo"]
    assert main([*argv, "--cluster", str(mixed)]) == 0
    assert f"note: {mixed} names no reference GPU type" in capsys.readouterr().err
    assert main([*argv, "--cluster", str(mixed), "--reference", "V100"]) == 0
    assert "names no reference" not in capsys.readouterr().err
    assert main([*argv, "--cluster", str(files["cluster"])]) == 0  # one type: no note
    assert "names no reference" not in capsys.readouterr().err


def test_repeat_and_load_on_the_span_are_applied_and_recorded(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two jobs (1 GPU x 100 s at 0 s, 2 GPUs x 50 s at 10 s) on 2 GPUs, replayed three
    times: copies every 20 s (span 10 s, n = 2); at load 0.5 on the span the gaps shrink
    by the factor that makes the GPU-time inside the span half of span x capacity."""
    out = files["dir"] / "jobs.csv"
    argv = sim(files, "--repeat", "3", "--load", "0.5", "--load-basis", "span", "--json", "-")
    assert main([*argv, "--jobs-out", str(out)]) == 0
    s = json.loads(capsys.readouterr().out)
    settings = s["settings"]
    assert (settings["repeat"], settings["load"], settings["load_basis"]) == (3, 0.5, "span")
    f = settings["load_factor"]
    # the definition by hand: submits 0, 10, 20, 30, 40, 50 (s / f); span 50 / f
    submits = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    gpus, dur = [1, 2] * 3, [100.0, 50.0] * 3
    inside = sum(g * min(d, (50.0 - t) / f) for g, d, t in zip(gpus, dur, submits, strict=True))
    assert inside / (50.0 / f) / 2.0 == pytest.approx(0.5)
    rows = out.read_text().splitlines()[1:]
    assert sorted(r.split(",")[0] for r in rows) == [
        "philly-1", "philly-1#1", "philly-1#2", "philly-2", "philly-2#1", "philly-2#2",
    ]  # fmt: skip


def test_shares_are_made_before_the_load_is_measured(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--share-fraction 1` makes the 1-GPU job a GPU share (the 2-GPU job stays whole),
    says so on stderr and in the JSON, and `--load` is the load of the shared job: the
    offered load of (g x milli / 1000 x d) over the span, the definition by hand."""
    from shared.sim.share_jobs import SHARE_MILLI

    out = files["dir"] / "jobs.csv"
    argv = sim(files, "--share-fraction", "1", "--load", "0.5", "--json", "-")
    assert main([*argv, "--jobs-out", str(out)]) == 0
    captured = capsys.readouterr()
    s = json.loads(captured.out)
    assert "100% of whole one-GPU jobs made GPU shares (seed 0)" in captured.err
    assert "1 of 2 jobs made shares" in captured.err
    assert s["settings"]["share_fraction"] == 1.0 and "0.25, 0.5, 0.75" in s["share_marking"]
    rows = {r.split(",")[0]: r.split(",") for r in out.read_text().splitlines()[1:]}
    milli = int(rows["philly-1"][6])
    assert milli in SHARE_MILLI and rows["philly-2"][6] == "1000"
    # offered load: (1 x milli/1000 x 100 + 2 x 50) / (10 / f) / 2 GPUs = 0.5
    f = s["settings"]["load_factor"]
    assert (milli / 1000 * 100 + 2 * 50) / (10 / f) / 2 == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--repeat", "0"], "--repeat 0: give a number of copies, 1 or more"),
        (["--load", "5", "--load-basis", "span"], "--load 5 --load-basis span: compressing"),
        (["--share-fraction", "2"], "--share-fraction must be within [0, 1], got 2.0"),
    ],
)
def test_bad_repeat_or_unreachable_load_is_one_line(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(sim(files, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
