"""`rltune bench val_episodes` on a small world written by the test: one row per
validation episode with every heuristic's ratio to the episode's best (so one of
them is exactly 1 and none below), a checkpoint's column, and the two summaries;
a world without a validation part is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.val_episodes import main
from rltune import main as rltune_main
from services.scoring.rl.args import HEURISTICS
from shared.errors import UserError
from tests.rltune.test_train import _files, _train


def _world(tmp: Path, val: bool = True) -> Path:
    trace, cluster = _files(tmp)
    world = tmp / "w.yaml"
    world.write_text(
        f"- name: t\n  trace: {trace}\n  format: jsonl\n  cluster: {cluster}\n"
        f"  train: [0.0, 0.6]\n" + ("  val: [0.6, 1.0]\n" if val else "")
    )
    return world


def test_rows_are_ratios_to_each_episodes_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rltune_main(_train(tmp_path, "c.pt", "--iterations", "1")) == 0
    capsys.readouterr()
    ckpt = str(tmp_path / "c.pt")
    argv = ["--world", str(_world(tmp_path)), "--val-episodes", "2", "--prefix", "8",
            "--jobs", "8", "--checkpoints", ckpt]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(" | ".join(HEURISTICS) + f" | {ckpt} |")
    rows = [line.split(" | ") for line in lines[2:4]]
    for row in rows:
        ratios = [float(v) for v in row[2 : 2 + len(HEURISTICS)]]
        assert min(ratios) == 1.0  # the best heuristic of the episode
        assert float(row[-1].rstrip(" |")) > 0
    assert lines[4].startswith("| geometric mean |")
    assert lines[5].startswith("| mean relative gain |")


def test_world_without_validation_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no part has a validation range"):
        main(["--world", str(_world(tmp_path, val=False)), "--prefix", "8", "--jobs", "8"])
