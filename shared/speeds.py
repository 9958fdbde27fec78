"""Default relative throughput per GPU type (higher = faster), used where a
cluster spec names no `speed` for a type. P100 = 1.0.

Measured (K80, P100, V100): Gavel's throughputs
(`../shared/traces/gavel/throughputs.json`, stanford-futuredata/gavel). For each
of the 26 model/batch-size job types measured alone (scale factor 1, key
"null"), take the ratio of its throughput on the type to that on P100; the
factor is the geometric mean of those ratios. `gavel_speeds(path)` recomputes
them from the file and a test checks the constants below against it.

Assumed (types Gavel did not measure), placed relative to Gavel's V100 by the
ratio of typical data-parallel training throughput in vendor and MLPerf-style
training benchmarks; they are round numbers, stated here so they can be argued
with, and a cluster YAML's `speed:` overrides any of them:

* T4 = 0.5 x V100 (70 W inference part; about half a V100 when training);
* A10 = 0.9 x V100; A100 = 2.0 x V100 (NVIDIA's A100 launch training speed-ups);
* V100 16 GB and 32 GB variants (V100M16, V100M32, V100_16GB, V100_32GB) = V100;
* G2, G3 (the Alibaba 2023 trace's anonymised models) and MISC (PAI 2020's
  "other" GPUs) = P100, the median generation of those fleets; unknown: 1.0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from shared.gpu_names import canonical

__all__ = ["DEFAULT_SPEEDS", "default_speed", "gavel_speeds", "speed_of"]

_K80_PER_P100 = 0.315163  # geomean throughput(K80)/throughput(P100), Gavel
_V100_PER_P100 = 1.060473  # geomean throughput(V100)/throughput(P100), Gavel

DEFAULT_SPEEDS: Mapping[str, float] = MappingProxyType(
    {
        "K80": round(_K80_PER_P100, 4),
        "P100": 1.0,
        "V100": round(_V100_PER_P100, 4),
        "V100M16": round(_V100_PER_P100, 4),
        "V100M32": round(_V100_PER_P100, 4),
        "V100_16GB": round(_V100_PER_P100, 4),
        "V100_32GB": round(_V100_PER_P100, 4),
        "T4": round(0.5 * _V100_PER_P100, 4),
        "A10": round(0.9 * _V100_PER_P100, 4),
        "A100": round(2.0 * _V100_PER_P100, 4),
        "G2": 1.0,
        "G3": 1.0,
        "MISC": 1.0,
    }
)


# the defaults by canonical model name: `t4`, `Tesla T4` and `v100-32gb` are T4 and V100M32
_BY_CANON = {canonical(k): v for k, v in DEFAULT_SPEEDS.items()}


def default_speed(gpu_type: str) -> float | None:
    """The built-in speed of `gpu_type` under any spelling of its model; None if unknown."""
    return _BY_CANON.get(canonical(gpu_type))


def speed_of(gpu_type: str, table: Mapping[str, float] = DEFAULT_SPEEDS) -> float:
    """Speed of `gpu_type` in `table`, else in the defaults (any spelling), else 1.0
    (a cluster spec refuses a type of unknown speed where speeds matter)."""
    if gpu_type in table:
        return table[gpu_type]
    known = default_speed(gpu_type)
    return 1.0 if known is None else known


def gavel_speeds(path: str | Path) -> dict[str, float]:
    """Per-type speed relative to P100 from Gavel's throughput file (see module doc)."""
    data = json.loads(Path(path).read_text())
    base = data["p100"]
    out: dict[str, float] = {}
    for gpu_type in ("k80", "p100", "v100"):
        logs = [
            math.log(rec["null"] / base[job]["null"])
            for job, rec in data[gpu_type].items()
            if job.endswith(", 1)") and job in base and rec["null"] > 0 and base[job]["null"] > 0
        ]
        out[gpu_type.upper()] = math.exp(sum(logs) / len(logs))
    return out
