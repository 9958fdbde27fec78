"""`rltune train` end to end on a small trace: checkpoint, CSV log, resume, one
result for a seed whatever the number of rollout processes, one-line errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rltune import main
from services.scoring.rl import load_checkpoint
from shared.policy_features import HISTORY_FEATURES


def _files(tmp: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    lines, t = [], 0.0
    for i in range(240):
        t += float(rng.exponential(60.0))
        lines.append(json.dumps({
            "job_id": f"j{i}", "submit_time": t, "num_gpus": int(rng.choice([1, 1, 2, 4])),
            "user": f"u{i % 5}", "duration_s": float(rng.lognormal(6.0, 1.5)),
        }))  # fmt: skip
    trace = tmp / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    cluster = tmp / "c.yaml"
    cluster.write_text("nodes:\n  - {name: n, count: 2, gpu_type: P100, gpus: 4}\n")
    return trace, cluster


def _train(tmp: Path, out: str, *extra: str) -> list[str]:
    trace, cluster = _files(tmp)
    return [
        "train", "--trace", str(trace), "--format", "jsonl", "--cluster", str(cluster),
        "--out", str(tmp / out), "--until", "12000", "--val-from", "9000", "--prefix", "8",
        "--jobs", "8", "--episodes", "2", "--val-every", "1", "--val-episodes", "1",
        "--warm-start", "1", "--workers", "0", *extra,
    ]  # fmt: skip


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path).net.state_dict()


def test_train_resume_and_determinism(tmp_path: Path) -> None:
    assert main(_train(tmp_path, "a.pt", "--iterations", "2")) == 0
    ckpt = load_checkpoint(tmp_path / "a.pt")
    assert ckpt.meta["trace"].endswith("t.jsonl") and list(ckpt.meta["clusters"])
    assert ckpt.meta["args"]["seed"] == 1 and ckpt.meta["validation"]["best_heuristic"]
    rows = list(csv.DictReader((tmp_path / "a.csv").open()))
    assert [r["iteration"] for r in rows] == ["1", "2"] and rows[1]["charts/val_gain"]
    # resume one more iteration
    resumed = [
        *_train(tmp_path, "a.pt", "--iterations", "3"),
        "--resume",
        str(tmp_path / "a.last.pt"),
    ]
    assert main(resumed) == 0
    assert len(list(csv.DictReader((tmp_path / "a.csv").open()))) == 3
    # the same three iterations in one go, rollouts on two processes: the same weights
    assert main([*_train(tmp_path, "b.pt", "--iterations", "3"), "--workers", "2"]) == 0
    a, b = _weights(tmp_path / "a.last.pt"), _weights(tmp_path / "b.last.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["linear.weight"], torch.zeros_like(a["linear.weight"]))


def test_train_ablation_features_and_the_wait_bound(tmp_path: Path) -> None:
    from services.scoring.rl import load_policy

    argv = _train(tmp_path, "n.pt", "--iterations", "1", "--features", "no-history")
    bound = ["--max-wait-h", "2", "--bound-gpus", "4", "--bound-scale", "backlog"]
    assert main([*argv, "--no-context", *bound]) == 0
    ckpt = load_checkpoint(tmp_path / "n.pt")
    assert not set(ckpt.features) & set(HISTORY_FEATURES) and not ckpt.net.cfg.context
    policy = load_policy(str(tmp_path / "n.pt"))  # the bound it was trained with serves
    assert (policy.max_wait_s, policy.bound_gpus, policy.bound_scale) == (7200.0, 4, "backlog")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--objective", "makespan"], "--objective 'makespan'"),
        (["--features", "oracle"], "--features 'oracle'"),
        (["--iterations", "0"], "--iterations must be positive"),
        (["--until", "yesterday"], "cannot read time 'yesterday'"),
        (["--offload-fraction", "1.5"], "--offload-fraction must be between 0 and 1"),
        (["--share-fraction", "-0.1"], "--share-fraction must be between 0 and 1"),
        (["--reward", "job"], "--reward 'job'"),
        (["--teacher", "oracle"], "--teacher 'oracle'"),
        (["--max-wait-h", "-1"], "--max-wait-h must be 0 or more"),
        (["--bound-gpus", "0"], "--bound-gpus must be positive"),
        (["--residual", "fifo"], "--residual 'fifo'"),
        (["--keep-every", "-1"], "--keep-every must be 0 or more"),
        (["--residual-bound", "-1"], "--residual-bound must be 0 or more"),
        (["--bound-scale", "load"], "--bound-scale 'load'"),
    ],
)
def test_train_user_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main([*_train(tmp_path, "e.pt"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_resume_from_other_features_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_train(tmp_path, "h.pt", "--iterations", "1")) == 0
    capsys.readouterr()
    argv = _train(tmp_path, "h.pt", "--iterations", "2", "--features", "no-history")
    assert main([*argv, "--resume", str(tmp_path / "h.last.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trained on feature set all, not no-history" in err[0]


def test_train_with_offload_reward_and_feature(tmp_path: Path) -> None:
    """`--offload-fraction` marks jobs (stated in the checkpoint), `--features offload`
    adds the offload pressure column, `--offload-reward` weights the reward's part."""
    argv = _train(tmp_path, "o.pt", "--iterations", "1", "--features", "offload")
    assert main([*argv, "--offload-fraction", "0.5", "--offload-reward", "1.0"]) == 0
    ckpt = load_checkpoint(tmp_path / "o.pt")
    assert ckpt.features[-1] == "offload_pressure" and ckpt.net.cfg.n_job == len(ckpt.features)
    assert "50% of jobs" in ckpt.meta["offload_marking"]
    assert ckpt.meta["args"]["offload_reward"] == 1.0


def test_train_with_shares_sees_the_share_vary(tmp_path: Path) -> None:
    """`--share-fraction` makes some one-GPU jobs GPU shares (stated in the checkpoint),
    so the `share` column is one the network saw vary, not a constant it ignores."""
    assert main(_train(tmp_path, "w.pt", "--iterations", "1")) == 0
    assert main(_train(tmp_path, "s.pt", "--iterations", "1", "--share-fraction", "1")) == 0
    col = list(load_checkpoint(tmp_path / "w.pt").features).index("share")
    whole, shares = (load_checkpoint(tmp_path / f"{n}.pt") for n in ("w", "s"))
    assert "share_marking" not in whole.meta and not bool(whole.net.job_norm.varies()[col])
    assert "100% of whole one-GPU jobs" in shares.meta["share_marking"]
    assert bool(shares.net.job_norm.varies()[col])


def test_train_privileged_teacher_and_round_credit(tmp_path: Path) -> None:
    """`--teacher drf-oracle` imitates another ranking than `drf` (the true run
    times reach the teacher: one imitation iteration, nothing else differs), and
    `--reward round` trains through PPO; both are recorded in the checkpoint,
    whose features are the usual run-time-free ones."""
    one = ("--iterations", "1", "--warm-iterations", "1")
    assert main([*_train(tmp_path, "d.pt", *one), "--teacher", "drf"]) == 0
    assert main([*_train(tmp_path, "o.pt", *one), "--teacher", "drf-oracle"]) == 0
    d, o = _weights(tmp_path / "d.last.pt"), _weights(tmp_path / "o.last.pt")
    assert not all(torch.equal(d[k], o[k]) for k in d)
    two = ("--iterations", "2", "--warm-iterations", "1", "--val-every", "2")
    argv = [*_train(tmp_path, "r.pt", *two), "--teacher", "drf-oracle", "--reward", "round"]
    assert main(argv) == 0
    ckpt = load_checkpoint(tmp_path / "r.last.pt")
    assert ckpt.meta["args"]["teacher"] == "drf-oracle" and ckpt.meta["args"]["reward"] == "round"
    assert ckpt.features == load_checkpoint(tmp_path / "d.last.pt").features
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert rows[0]["losses/imitation"] != "nan" and rows[1]["losses/policy"] != "nan"


def test_train_residual_with_shuffled_ties_and_snapshots(tmp_path: Path) -> None:
    """`--residual drf` trains a residual network (its base recorded in the
    checkpoint, its correction moved off zero by PPO), with `--shuffle-ties`
    (what it does to episodes: test_rl_residual.py); `--keep-every 1` keeps each
    iteration's checkpoint with its number."""
    argv = _train(tmp_path, "r.pt", "--iterations", "2", "--warm-iterations", "0")
    assert main([*argv, "--residual", "drf", "--shuffle-ties", "--keep-every", "1"]) == 0
    ckpt = load_checkpoint(tmp_path / "r.it2.pt")
    assert ckpt.net.cfg.base == "drf" and ckpt.meta["iteration"] == 2
    assert ckpt.features[ckpt.net.cfg.base_wait_col] == "log_wait_s"
    assert ckpt.features[ckpt.net.cfg.base_rank_col] == "vc_share_rank"
    assert (tmp_path / "r.it1.pt").exists()
    out = ckpt.net.state_dict()["head.2.weight"]
    assert not torch.equal(out, torch.zeros_like(out))
