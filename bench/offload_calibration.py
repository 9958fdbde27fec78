"""Store two `rltune bench offload --json` runs as the simulator's offload calibration.

    python -m bench.offload_calibration CALIBRATE.json VALIDATE.json

writes shared/sim/offload_calibration.json: both runs (their losses dropped) and
the constants `fit_calibration` fits on the first. The second is held out:
tests/shared/sim/test_offload_cost.py checks the model's predicted step times
against its measured ones.

    python -m bench.offload_calibration --predict FIT.json OTHER.json

changes nothing: it prints, for the first architecture of each run, the step
times the stored calibration predicts and those of constants fitted on FIT.json,
against the measured ones. A run without a recorded profile (the GPU runs in
docs/results/data/offload-h100/) borrows the stored calibration's profile, which is allowed
only for the same model (its config): the access order and tensor sizes are the
model's, the budgets are the run's own.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shared.sim.offload_cost import (
    CALIBRATION_FILE,
    fit_calibration,
    load_calibration,
    predict_bench,
)

__all__ = ["main", "with_profile"]


def _slim(run: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in run.items() if k != "losses_identical_to_none"}
    for s in ("none", "lru", "fixed", "tencache"):
        out[s] = {k: v for k, v in run[s].items() if k != "losses"}
    return out


def _one_run(data: dict[str, Any]) -> dict[str, Any]:
    """One model's run: the file itself (one model), or its first architecture."""
    if "none" in data:
        return data
    arch = next(k for k, v in data.items() if isinstance(v, dict) and "none" in v)
    run: dict[str, Any] = data[arch]
    return run


def with_profile(run: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """`run` with a profile: its own, else the stored run's (same model only) with the
    run's budgets."""
    if "profile" in run:
        return run
    mine, theirs = run["model"]["config"], stored["model"]["config"]
    mine_arch, their_arch = run["model"].get("arch", "gpt"), stored["model"].get("arch", "gpt")
    if mine_arch != their_arch or any(
        mine.get(k) != theirs.get(k) for k in ("dim", "layers", "vocab")
    ):
        raise ValueError(
            f"no profile in the run, and its model ({mine_arch} {mine}) is not the stored "
            f"one ({their_arch} {theirs})"
        )
    profile = dict(stored["profile"])
    profile["fast_budget_bytes"] = run["model"]["fast_budget_bytes"]
    profile["host_budget_bytes"] = run["model"]["host_budget_bytes"]
    return {**run, "profile": profile}


def _predict(paths: list[str]) -> int:
    stored = json.loads(CALIBRATION_FILE.read_text())
    runs = [with_profile(_one_run(json.loads(Path(p).read_text())), stored["calibrate"])
            for p in paths]  # fmt: skip
    fit = fit_calibration(runs[0])
    fitted = {k: v for k, v in asdict(fit).items() if k != "source"}
    print(f"stored (fitted on {stored['calibrate']['model']['config']}): {stored['fitted']}")
    print(f"fitted on {paths[0]}: {fitted}")
    for path, run in zip(paths, runs, strict=True):
        for name, cal in (("stored", load_calibration()), ("fitted", fit)):
            pred = predict_bench(run, cal)
            print(f"{path} {name}:", "  ".join(
                f"{s} {pred[s]:.0f} / {run[s]['step_ms']:.0f} ms "
                f"({pred[s] / run[s]['step_ms'] - 1:+.0%})"
                for s in ("lru", "fixed", "tencache")))  # fmt: skip
    return 0


def _usage(problem: str) -> int:
    print(f"{problem}; usage: python -m bench.offload_calibration [--predict] FIRST.json "
          "SECOND.json", file=sys.stderr)  # fmt: skip
    return 2


def main(argv: list[str]) -> int:
    predict = argv[:1] == ["--predict"]
    paths = argv[1:] if predict else argv
    if len(paths) != 2 or any(a.startswith("-") for a in paths):
        return _usage(f"expected two run files, got {' '.join(argv) or 'none'}")
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        return _usage(f"no such file: {missing[0]}")
    if predict:
        return _predict(paths)
    cal_run, val_run = (_slim(_one_run(json.loads(Path(p).read_text()))) for p in paths)
    cal = fit_calibration(cal_run)
    fitted = {k: v for k, v in asdict(cal).items() if k != "source"}
    data = {"fitted": fitted, "calibrate": cal_run, "validate": val_run}
    CALIBRATION_FILE.write_text(json.dumps(data, indent=1) + "\n")
    for name, run in (("calibrate", cal_run), ("validate", val_run)):
        pred = predict_bench(run, cal)
        print(name, {s: f"{pred[s]:.0f} / {run[s]['step_ms']:.0f} ms" for s in pred})
    print("fitted", fitted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
