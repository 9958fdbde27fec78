"""`rltune bench offload` end to end on a small GPT-2: a baseline that cannot start
at the fast-tier budget is reported as such and the others are still compared;
the ratios come back from the per-strategy step times; every strategy that ran
trained to `none`'s losses exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.cli import main

pytest.importorskip("transformers")


def test_a_baseline_that_cannot_start_is_reported_and_the_rest_compared(tmp_path: Path) -> None:
    out = tmp_path / "offload.json"
    # GPT-2 with a 4096-token tied embedding (1 MiB): at 80% of 4.4 MB the fast
    # tier holds lru's 3 buffers of it but not fixed's 4
    argv = ["bench", "offload", "--device", "cpu", "--archs", "gpt2", "--dim", "64",
            "--layers", "2", "--vocab", "4096", "--seq", "16", "--batch", "2", "--steps", "1",
            "--warmup", "1", "--fast-frac", "0.8", "--nvme-dir", str(tmp_path),
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(out.read_text())
    g = r["gpt2"]
    assert "fixed: fast budget" in g["fixed"]["cannot_start"]
    assert g["ratios"]["tencache_vs_fixed"] is None
    assert set(g["losses_identical_to_none"]) == {"none", "lru", "tencache"}
    assert all(g["losses_identical_to_none"].values())
    want = g["lru"]["step_ms"] / g["tencache"]["step_ms"]
    assert g["ratios"]["tencache_vs_lru"] == pytest.approx(want, abs=1e-3)
    assert r["settings"]["device"] == "cpu"
    assert list(tmp_path.iterdir()) == [out]  # its swap files are gone


def test_cuda_asked_for_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench", "offload", "--device", "cuda"]) == 2
    assert main(["bench", "offload_link"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("torch.cuda.is_available() is False" in e for e in err)
