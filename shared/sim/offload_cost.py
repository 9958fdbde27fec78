"""The simulator's offload cost model (DESIGN.md, "10Cache"): how much slower a
job that trains with 10Cache runs, given who else offloads on its nodes.

Per step, a job's GPU moves the bytes its plan streams (offload_traffic.py: a
replay of its profile's access order under the planner's plan). A copy costs
its bytes at the bandwidth it gets plus a fixed time per copy. Copies started
ahead of use (prefetches and the write-backs they cause) overlap compute up to
`hidden_fraction` of their time, never more than the step's compute; copies made
at the moment of use never do:

    copy_ms     = bytes / bandwidth share + copies · per_copy_ms
    unhidden_ms = copy_demand_ms + copy_ahead_ms − min(h · copy_ahead_ms, compute_ms)
    step_ms     = compute_ms + unhidden_ms,     slowdown f = step_ms / compute_ms

Calibration (`fit_calibration`, stored in offload_calibration.json): from one
`rltune bench offload --json` run (its "calibrate" entry), the bandwidth, the
per-copy time and h that best reproduce (least squares) its measured
lru / fixed / tencache step times over its `none` step time, with the bytes and
copies of each strategy replayed from the run's recorded profile (never the
measured bytes). A second run ("validate") checks the prediction
(tests/shared/sim/test_offload_cost.py).

On a simulated cluster node: every offloading GPU on the node gets an equal
share of the node's `pcie_gbps` (all its bytes cross it) and of its `nvme_gbps`
(the bytes of NVMe-homed tensors), both in GB/s (10^9 bytes/s); the slower of
the two stages sets the copy time; h comes from the calibration; the per-copy
time is not applied (it is the bench machine's software cost per swap-file
copy, and cluster copies of MB-sized tensors are bandwidth-bound). A multi-node
job runs at its slowest node.

A trace job's compute per step (no profile says it): the 6·N·tokens rule of
transformer training, N = parameters (param_bytes / 4, fp32), 16,384 tokens per
GPU per step, 50 TFLOP/s sustained on a V100 (40% of its 125 peak), scaled by
the cluster's relative GPU speeds. Stated constants, not measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec

from shared.messages import TensorProfile
from shared.offload.planner import Budgets
from shared.sim.offload_traffic import STRATEGIES, Traffic, step_traffic

__all__ = [
    "CALIBRATION_FILE",
    "Calibration",
    "JobDemand",
    "StepCost",
    "default_calibration",
    "fit_calibration",
    "load_calibration",
    "predict_bench",
    "step_cost",
]

CALIBRATION_FILE = Path(__file__).with_name("offload_calibration.json")

TOKENS_PER_GPU_STEP = 16_384  # 8 sequences of 2,048 tokens per GPU per step
V100_FLOPS = 50e12  # sustained training FLOP/s of one V100 (40% of 125 TFLOP/s)
GPU_MEM_GIB = {"K80": 12.0, "P100": 16.0, "V100": 16.0, "T4": 16.0, "A10": 24.0, "A100": 40.0}
FAST_SHARE = 0.5  # of a GPU's memory for parameters and optimizer states (rest: activations)
HOST_SHARE = 0.5  # of a node's host memory per GPU for pinned slabs


@dataclass(frozen=True, slots=True)
class Calibration:
    hidden_fraction: float  # h: share of ahead-of-use copy time hidden behind compute
    copy_gbps: float  # the bench machine's copy bandwidth, GB/s
    per_copy_ms: float  # the bench machine's fixed time per tensor copy
    source: str = ""  # where it came from


def load_calibration(path: Path = CALIBRATION_FILE) -> Calibration:
    """The fitted constants stored beside this module (`fitted` of the file)."""
    data: dict[str, Any] = json.loads(path.read_text())
    fit = data["fitted"]
    return Calibration(
        float(fit["hidden_fraction"]), float(fit["copy_gbps"]), float(fit["per_copy_ms"]),
        f"{path.name}: fitted on its 'calibrate' run",
    )  # fmt: skip


def bench_traffic(run: dict[str, Any]) -> dict[str, Traffic]:
    """Each strategy's replayed traffic on a bench run's recorded profile."""
    profile = msgspec.convert(run["profile"], TensorProfile)
    budgets = profile_budgets(profile)
    return {s: step_traffic(profile, s, budgets) for s in STRATEGIES}


def predict_bench(run: dict[str, Any], cal: Calibration) -> dict[str, float]:
    """Predicted median step ms of every strategy of a bench run: its `none` step time
    is the compute, the rest comes from the profile and the calibration."""
    compute = float(run["none"]["step_ms"])
    return {
        s: step_cost(tr, compute, cal.hidden_fraction, cal.copy_gbps, None, cal.per_copy_ms).step_ms
        for s, tr in bench_traffic(run).items()
    }


def fit_calibration(run: dict[str, Any]) -> Calibration:
    """Least squares over (1/bandwidth, per-copy ms) for each h on a 0.01 grid in
    [0, 0.95]; the h with the smallest residual wins (lowest h on ties)."""
    traffic = bench_traffic(run)
    compute = float(run["none"]["step_ms"])
    best: tuple[float, float, float, float] | None = None
    for k in range(96):
        h = k / 100
        rows = [
            (tr.demand_bytes / 1e6 + (1 - h) * tr.ahead_bytes / 1e6,
             tr.demand_misses + (1 - h) * tr.prefetches,
             float(run[s]["step_ms"]) - compute)
            for s, tr in traffic.items() if s != "none"
        ]  # fmt: skip
        x, c = _lstsq2(rows)
        if x <= 0 or c < 0:
            continue
        res = sum((a * x + b * c - y) ** 2 for a, b, y in rows)
        if best is None or res < best[0] - 1e-9:
            best = (res, x, c, h)
    if best is None:
        raise ValueError("the bench run cannot be fitted (no positive bandwidth)")
    _, x, c, h = best
    return Calibration(h, round(1 / x, 6), round(c, 6), "fitted")


def _lstsq2(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of y ≈ a·x + b·c over rows (a, b, y) (normal equations)."""
    saa = sum(a * a for a, _, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    say = sum(a * y for a, _, y in rows)
    sby = sum(b * y for _, b, y in rows)
    det = saa * sbb - sab * sab
    if abs(det) < 1e-12:
        return (say / saa if saa else 0.0), 0.0
    return (say * sbb - sby * sab) / det, (saa * sby - sab * say) / det


@lru_cache(maxsize=1)
def default_calibration() -> Calibration:
    return load_calibration()


@dataclass(frozen=True, slots=True)
class StepCost:
    compute_ms: float
    unhidden_ms: float
    copy_ms: float  # all copies of the step at the bandwidth given
    copies: int  # tensor copies into the fast tier per step
    late: float = 0.0  # accesses that waited for their tensor (demand misses, late prefetches)
    accesses: int = 0

    @property
    def hit_rate(self) -> float:
        """Accesses that found their tensor in the fast tier (a prefetch counts when its
        copy was hidden: the share of prefetch copy time compute hid)."""
        return 1.0 - self.late / self.accesses if self.accesses else 1.0

    @property
    def migration_ms(self) -> float:
        """Mean time of one tensor copy (write-back included) at this bandwidth."""
        return self.copy_ms / self.copies if self.copies else 0.0

    @property
    def step_ms(self) -> float:
        return self.compute_ms + self.unhidden_ms

    @property
    def slowdown(self) -> float:
        return self.step_ms / self.compute_ms if self.compute_ms > 0 else 1.0


def step_cost(
    traffic: Traffic,
    compute_ms: float,
    hidden_fraction: float,
    gbps: float,
    nvme_gbps: float | None = None,
    per_copy_ms: float = 0.0,
) -> StepCost:
    """One step's time with `traffic` copied at `gbps` (and its NVMe part at `nvme_gbps`)."""
    moved = traffic.bytes_moved
    if moved == 0:
        return StepCost(compute_ms, 0.0, 0.0, 0, 0.0, traffic.accesses)
    ms_per_byte = 1.0 / (gbps * 1e6)
    if nvme_gbps is not None and traffic.nvme_bytes:
        ms_per_byte = max(ms_per_byte, traffic.nvme_bytes / moved / (nvme_gbps * 1e6))
    ahead_ms = traffic.ahead_bytes * ms_per_byte + traffic.prefetches * per_copy_ms
    demand_ms = traffic.demand_bytes * ms_per_byte + traffic.demand_misses * per_copy_ms
    hidden = min(hidden_fraction * ahead_ms, compute_ms)
    copies = traffic.prefetches + traffic.demand_misses
    late = traffic.demand_misses + (traffic.prefetches * (1 - hidden / ahead_ms) if ahead_ms else 0)
    return StepCost(
        compute_ms, demand_ms + ahead_ms - hidden, demand_ms + ahead_ms, copies, late,
        traffic.accesses,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class JobDemand:
    """What one offloading GPU of a job asks of its node, per step."""

    traffic: Traffic
    compute_ms: float  # on the reference speed 1.0

    def cost(self, speed: float, pcie_share: float, nvme_share: float, h: float) -> StepCost:
        return step_cost(self.traffic, self.compute_ms / speed, h, pcie_share, nvme_share)


def profile_budgets(profile: TensorProfile) -> Budgets:
    return Budgets(profile.fast_budget_bytes, profile.host_budget_bytes)
