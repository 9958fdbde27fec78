"""A trace for the "never sees a true run time" checks (tests/shared/test_policy_api.py,
tests/services/scoring/test_rl_policy.py): rescaling its long jobs changes nothing a
policy may know before SHORT_END."""

from __future__ import annotations

import numpy as np

from shared.traces import TraceJob

SHORT_END = 10_200.0  # no rescaled job can finish before this


def canary_trace(scale: np.ndarray | None) -> list[TraceJob]:
    """10 short jobs that finish (history), then 30 long ones that queue; `scale`
    multiplies the long ones' durations (none finishes before SHORT_END)."""
    short = [TraceJob(f"s{i}", float(i), 100.0, 1, vc="ab"[i % 2]) for i in range(10)]
    rng = np.random.default_rng(1)
    long = []
    for i in range(30):
        d = 10_000.0 + float(rng.integers(0, 5000))
        if scale is not None:
            d *= float(scale[i])
        long.append(
            TraceJob(f"l{i}", 200.0 + 7 * i, d, int(rng.choice([1, 2, 4])), vc="abc"[i % 3])
        )
    return short + long
