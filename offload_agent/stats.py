"""Counters the engine keeps: hits, migrations, bytes, peaks, step times."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from shared.messages import OffloadStats

__all__ = ["CacheStats", "percentile"]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


@dataclass
class CacheStats:
    """An access is a *hit* when the tensor is ready in the fast tier, *late* when a
    prefetch for it is still in flight (we wait), a *miss* when nothing was under
    way (fetched on demand). Hit rate counts hits only."""

    hits: int = 0
    late: int = 0
    misses: int = 0
    bytes_in: int = 0  # into the fast tier
    bytes_out: int = 0  # out of the fast tier (write-backs)
    migration_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    peak_fast_bytes: int = 0
    peak_host_bytes: int = 0
    overflow_bytes: int = 0  # fast buffers added past the budget (all pinned on a demand)
    # the training thread's time blocked on copies: a late or missed access, a
    # buffer's previous tensor still being written, a drain (the copy time not
    # hidden behind compute; on CUDA, the host's wait, not the stream's)
    wait_ms: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def access(self, outcome: str) -> None:
        if outcome == "hit":
            self.hits += 1
        elif outcome == "late":
            self.late += 1
        else:
            self.misses += 1

    def migrated(self, nbytes_in: int, nbytes_out: int, ms: float) -> None:
        """Called from I/O threads."""
        with self._lock:
            self.bytes_in += nbytes_in
            self.bytes_out += nbytes_out
            self.migration_ms.append(ms)

    def memory(self, fast: int, host: int) -> None:
        self.peak_fast_bytes = max(self.peak_fast_bytes, fast)
        self.peak_host_bytes = max(self.peak_host_bytes, host)

    @property
    def accesses(self) -> int:
        return self.hits + self.late + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 1.0

    def reset(self) -> None:
        """Forget counts (after warm-up); peaks are kept."""
        with self._lock:
            self.hits = self.late = self.misses = 0
            self.bytes_in = self.bytes_out = 0
            self.migration_ms = []
            self.step_ms = []
            self.wait_ms = 0.0

    def to_message(
        self, job_id: str, node_id: str, *, fast_budget: int, host_budget: int
    ) -> OffloadStats:
        with self._lock:
            lat = list(self.migration_ms)
        steps = self.step_ms
        return OffloadStats(
            job_id=job_id,
            node_id=node_id,
            hit_rate=self.hit_rate,
            migration_ms_p50=percentile(lat, 50),
            migration_ms_p99=percentile(lat, 99),
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            gpu_mem_util=self.peak_fast_bytes / fast_budget if fast_budget else 0.0,
            host_mem_util=self.peak_host_bytes / host_budget if host_budget else 0.0,
            step_ms=sum(steps) / len(steps) if steps else 0.0,
            time=time.time(),
        )
