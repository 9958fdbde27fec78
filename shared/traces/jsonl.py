"""JSON Lines reader (`--format jsonl`): one JobSpec (DESIGN.md) per line, plus
`duration_s` (the true run time, seconds, on the trace's reference GPU type)
for simulation. `submit_time` absent means 0 (everything arrives at once).

Each line is validated as a `JobSpec` (msgspec): a line that does not decode or
validate is counted as "bad row" with msgspec's reason; blank lines are ignored.
As the arrival service does, a share of a GPU (`gpu_milli` < 1000) on more than
one GPU is refused ("bad row"), and a `job_id` already read is skipped
("duplicate job_id": a per-job file holds one job per id).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import msgspec

from shared.messages import JobSpec
from shared.traces import SkipStats, TraceJob
from shared.traces._io import open_text

__all__ = ["read_jsonl"]


class _TraceLine(JobSpec, omit_defaults=True):
    duration_s: Annotated[float, msgspec.Meta(ge=0.0, le=1e10)] | None = None


_DECODER = msgspec.json.Decoder(_TraceLine)


def read_jsonl(path: str | Path, stats: SkipStats) -> Iterator[TraceJob]:
    fh = open_text(path)
    seen: set[str] = set()
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                spec = _DECODER.decode(line)
            except msgspec.DecodeError as exc:
                stats.skip(f"bad row ({str(exc).splitlines()[0][:80]})", line)
                continue
            if spec.duration_s is None:
                stats.skip("no duration_s", line)
                continue
            if spec.gpu_milli < 1000 and spec.num_gpus != 1:
                stats.skip("bad row (gpu_milli < 1000, a share of one GPU, needs num_gpus 1)", line)
                continue
            if spec.job_id in seen:
                stats.skip("duplicate job_id", line)
                continue
            seen.add(spec.job_id)
            param = spec.offload.param_bytes if spec.offload is not None else None
            yield TraceJob(
                job_id=spec.job_id,
                submit_s=spec.submit_time or 0.0,
                duration_s=spec.duration_s,
                num_gpus=spec.num_gpus,
                gpu_milli=spec.gpu_milli,
                gpu_types=tuple(spec.gpu_types),
                user=spec.user,
                vc=spec.vc,
                model=spec.model,
                param_bytes=param or None,
                weight=spec.weight,
                project=spec.project,
                app=spec.app,
                time_limit_s=spec.time_limit_s,
                priority_class=spec.priority_class,
            )
