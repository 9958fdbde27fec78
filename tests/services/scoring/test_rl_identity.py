"""The learned policy and the identity features: the shipped checkpoint reads none of
them (its scores cannot depend on them), and a checkpoint that reads one is refused,
in one line, on a trace whose jobs never carry the field it is computed from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from services.scoring.rl import SHIPPED, load_checkpoint
from services.scoring.rl.args import FEATURE_SETS
from services.scoring.rl.checkpoint import Checkpoint, save_checkpoint
from services.scoring.rl.network import NetConfig, ScoreNet
from services.scoring.rl.policy import RLPolicy
from shared.policy_features import GLOBAL_FEATURES, IDENTITY_FEATURES, JOB_FEATURES
from tests.paths import PHILLY, THETAGPU

ROOT = Path(__file__).resolve().parents[3]


def test_shipped_checkpoint_reads_no_identity_feature() -> None:
    ckpt = load_checkpoint(SHIPPED)
    assert not set(ckpt.features) & set(IDENTITY_FEATURES)
    policy = RLPolicy(ckpt.net, ckpt.features)
    assert policy.needs == () and not policy.reads_identity
    # so the columns it scores are the same whether the identity block is filled or
    # not: take any rows, change only identity columns, the scores stay
    rng = np.random.default_rng(3)
    x = rng.normal(1.0, 1.0, size=(40, len(JOB_FEATURES))).astype(np.float32)
    y = x.copy()
    y[:, [JOB_FEATURES.index(f) for f in IDENTITY_FEATURES]] += 5.0
    g = rng.normal(size=len(GLOBAL_FEATURES)).astype(np.float32)
    np.testing.assert_array_equal(policy.scores(x, g), policy.scores(y, g))


def identity_checkpoint(tmp_path: Path) -> Path:
    features = FEATURE_SETS["identity"]
    net = ScoreNet(NetConfig(len(features), len(GLOBAL_FEATURES)))
    path = tmp_path / "ident.pt"
    save_checkpoint(path, Checkpoint(net, features))
    return path


def simulate(trace: Path, fmt: str, cluster: str, policy: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rltune", "simulate", "--trace", str(trace), "--format", fmt,
         "--cluster", str(ROOT / "clusters" / cluster), "--policy", policy, "--limit", "60"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip


def test_identity_checkpoint_is_refused_on_a_trace_without_identity(tmp_path: Path) -> None:
    path = identity_checkpoint(tmp_path)
    proc = simulate(PHILLY, "philly", "philly.yaml", f"rl:{path}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs user" in lines[0] and "Traceback" not in proc.stderr
    # on ThetaGPU (users, projects, requested times) it runs; it names no app, so a
    # checkpoint reading app features is refused there too
    ok = simulate(THETAGPU, "alcf", "thetagpu.yaml", f"rl:{path}")
    assert ok.returncode == 2 and "needs app" in ok.stderr.strip()
    no_app = tuple(f for f in FEATURE_SETS["identity"] if "app" not in f)
    net = ScoreNet(NetConfig(len(no_app), len(GLOBAL_FEATURES)))
    save_checkpoint(path, Checkpoint(net, no_app))
    ok = simulate(THETAGPU, "alcf", "thetagpu.yaml", f"rl:{path}")
    assert ok.returncode == 0, ok.stderr
    # a checkpoint trained on traces with and without identity says what it needs
    save_checkpoint(path, Checkpoint(net, no_app, meta={"needs": []}))
    assert simulate(PHILLY, "philly", "philly.yaml", f"rl:{path}").returncode == 0


def test_trained_identity_checkpoint_needs_what_its_training_trace_carried(
    tmp_path: Path,
) -> None:
    from rltune import main
    from tests.rltune.test_train import _train

    argv = _train(tmp_path, "i.pt", "--iterations", "1", "--features", "identity")
    assert main(argv) == 0
    ckpt = load_checkpoint(tmp_path / "i.pt")
    assert set(ckpt.features) >= set(IDENTITY_FEATURES)
    # the training trace names users, but no project, app or requested time
    assert ckpt.meta["needs"] == ["user"]
    proc = simulate(PHILLY, "philly", "philly.yaml", f"rl:{tmp_path / 'i.pt'}")
    assert proc.returncode == 2 and "needs user" in proc.stderr
