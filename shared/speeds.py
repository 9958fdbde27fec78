"""Default relative throughput per GPU type (higher = faster), used where a
cluster spec names no `speed` for a type.

K80, P100 and V100 come from Gavel's measured throughputs
(`../shared/traces/gavel/throughputs.json`): for each of the 26 model/batch-size
job types measured alone (scale factor 1, key "null"), the ratio of its
throughput on the type to that on K80; the factor is the geometric mean of
those ratios over the job types, normalised so P100 = 1.0.
Types Gavel did not measure are placed relative to those.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["DEFAULT_SPEEDS", "speed_of"]

_K80_PER_P100 = 1.0 / 3.172958  # geomean throughput(K80)/throughput(P100), Gavel
_V100_PER_P100 = 3.364836 / 3.172958  # geomean throughput(V100)/throughput(P100), Gavel

DEFAULT_SPEEDS: Mapping[str, float] = MappingProxyType(
    {
        "K80": round(_K80_PER_P100, 4),
        "P100": 1.0,
        "V100": round(_V100_PER_P100, 4),
    }
)


def speed_of(gpu_type: str, table: Mapping[str, float] = DEFAULT_SPEEDS) -> float:
    """Speed of `gpu_type` in `table`, else in the defaults, else 1.0 (unknown type)."""
    if gpu_type in table:
        return table[gpu_type]
    return DEFAULT_SPEEDS.get(gpu_type, 1.0)
