"""What `rltune train --world FILE` trains and validates on: several traces, each on
its own cluster, each cut into a training part and a validation part by submit
order, so that one checkpoint learns across GPU and HPC traces, with identity and
without, several cluster shapes and loads.

The world file is YAML or JSON, a list of parts; paths are relative to the file:

    - name: thetagpu                 # shown in the log
      trace: ../../../shared/traces/alcf/thetagpu-2023-jan-apr.csv
      format: alcf
      cluster: ../../clusters/thetagpu.yaml   # or a list; swf: may be omitted (header)
      until: "2023-04-09"            # optional: only jobs submitted before (UTC date)
      train: [0.0, 0.8]              # that part of the (remaining) jobs by submit order
      val: [0.8, 1.0]                # optional: the validation part, never trained on
      weight: 2                      # optional: drawn this many times as often (1)

Every (part, cluster) pair is one world; an episode draws a world, then a slice of
its jobs and a load (env.py). A part's training and validation ranges may not
overlap (UserError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.cluster import ClusterSpec, load_cluster
from shared.errors import UserError
from shared.listfile import trace_entries
from shared.sim import load_jobs
from shared.traces import SkipStats, TraceJob
from shared.traces._io import parse_time

__all__ = ["Part", "World", "load_parts", "load_world_file"]

_KEYS = {"name", "trace", "format", "cluster", "since", "until", "train", "val", "weight"}


@dataclass(frozen=True)
class Part:
    name: str
    trace: Path
    format: str
    clusters: tuple[Path, ...]  # empty: the SWF header's
    since: str = ""
    until: str = ""
    train: tuple[float, float] = (0.0, 1.0)
    val: tuple[float, float] | None = None
    weight: int = 1


@dataclass
class World:
    """Parallel lists: world i is `jobs[i]` on `clusters[i]` (`names[i]` in logs)."""

    names: list[str]
    jobs: list[list[TraceJob]]
    clusters: list[ClusterSpec]


def _range(where: str, key: str, v: Any) -> tuple[float, float]:
    if (
        not isinstance(v, list)
        or len(v) != 2
        or not all(isinstance(x, int | float) for x in v)
        or not 0.0 <= v[0] < v[1] <= 1.0
    ):
        raise UserError(f"{where}: `{key}` must be [from, to] with 0 <= from < to <= 1")
    return float(v[0]), float(v[1])


def load_parts(path: str | Path) -> list[Part]:
    """The parts of a world file; UserError naming the part and key if malformed."""
    p = Path(path)
    parts = []
    for i, (where, c) in enumerate(trace_entries(p, "world", "part", _KEYS)):
        train = _range(where, "train", c.get("train", [0.0, 1.0]))
        val = None if c.get("val") is None else _range(where, "val", c["val"])
        if val is not None and max(train[0], val[0]) < min(train[1], val[1]):
            raise UserError(f"{where}: `train` {list(train)} and `val` {list(val)} overlap")
        weight = c.get("weight", 1)
        if not isinstance(weight, int) or isinstance(weight, bool) or weight <= 0:
            raise UserError(f"{where}: `weight` must be a positive whole number")
        cl = c.get("cluster")
        cls = [] if cl is None else cl if isinstance(cl, list) else [cl]
        if not cls and c["format"] != "swf":
            raise UserError(f"{where}: `cluster` is required for format {c['format']}")
        parts.append(
            Part(
                name=str(c.get("name") or f"part{i + 1}"),
                trace=p.parent / c["trace"],
                format=c["format"],
                clusters=tuple(p.parent / str(x) for x in cls),
                since=str(c.get("since") or ""),
                until=str(c.get("until") or ""),
                train=train,
                val=val,
                weight=weight,
            )
        )
    return parts


def _clusters(part: Part) -> list[ClusterSpec]:
    if part.clusters:
        return [load_cluster(c) for c in part.clusters]
    if part.format != "swf":  # load_parts refuses it; a Part built by hand may not
        raise UserError(f"world part {part.name}: `cluster` is required for {part.format}")
    from shared.traces.swf import swf_cluster

    return [swf_cluster(part.trace)]


def load_world_file(path: str | Path, which: str) -> World:
    """The training (`which="train"`) or validation (`"val"`) worlds of a world file."""
    names: list[str] = []
    jobs_out: list[list[TraceJob]] = []
    clusters_out: list[ClusterSpec] = []
    for part in load_parts(path):
        rng = part.train if which == "train" else part.val
        if rng is None:
            continue
        clusters = _clusters(part)
        jobs = load_jobs(part.trace, part.format, clusters[0], SkipStats())
        try:
            since = parse_time(_day(part.since)) if part.since else -math.inf
            until = parse_time(_day(part.until)) if part.until else math.inf
        except ValueError:
            raise UserError(f"world part {part.name}: since/until: give YYYY-MM-DD") from None
        jobs = [j for j in jobs if since <= j.submit_s < until]
        lo, hi = (round(f * len(jobs)) for f in rng)
        picked = jobs[lo:hi]
        if not picked:
            raise UserError(f"world part {part.name}: no job in its {which} range")
        for c in clusters:
            for _ in range(part.weight if which == "train" else 1):
                names.append(f"{part.name}/{c.name}")
                jobs_out.append(picked)
                clusters_out.append(c)
    return World(names, jobs_out, clusters_out)


def _day(text: str) -> str:
    return text if any(ch in text for ch in " T") else text + " 00:00:00"
