"""Store two `rltune bench offload --json` runs as the simulator's offload calibration.

    python -m bench.offload_calibration CALIBRATE.json VALIDATE.json

writes shared/sim/offload_calibration.json: both runs (their losses dropped) and
the constants `fit_calibration` fits on the first. The second is held out:
tests/shared/sim/test_offload_cost.py checks the model's predicted step times
against its measured ones.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shared.sim.offload_cost import CALIBRATION_FILE, fit_calibration, predict_bench

__all__ = ["main"]


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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench.offload_calibration CALIBRATE.json VALIDATE.json",
              file=sys.stderr)  # fmt: skip
        return 2
    cal_run, val_run = (_slim(_one_run(json.loads(Path(p).read_text()))) for p in argv)
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
