"""Where the offloading jobs' migration time comes from, per job, from a `--jobs-out` CSV.

    python -m bench.offload_breakdown CLUSTER.yaml JOBS.csv [JOBS.csv ...]

Replays the CSV's starts and finishes through the simulator's cost model
(shared/sim/offload_state.py: the same per-node shares and slowdowns) and splits
each offloading job's `offload_s` into

* alone: what it costs with its nodes' links to itself (its own GPUs only),
* at start: the extra from the offloading jobs on its nodes when it started,
  those started at the same instant (one placement round) included, while
  they stay,
* later: the extra from offloading jobs that came to its nodes after it.

Over any stretch at slowdown f the job does dt / f of its work and loses
dt · (1 − 1/f); the three parts are that work times (f_alone − 1),
(f_start − f_alone) and (f − f_start), so they add up to `offload_s` (printed:
the largest difference). Per node group (a node's name up to its last "-") and
GPU count, the share of the 10% of offloading jobs that lose the most, and for
single-node jobs their alone cost where they ran against the cheapest group
for each (its work moved there at the groups' relative GPU speeds; no capacity
limit: a floor no placer reaches).

A re-placed job (`restart_s` > 0, services/placement/replace.py) has one row per
segment, each split on its own: its first `restart_s` seconds it holds its
GPUs and takes its share of its nodes' links without progress or loss of its
own (as the simulator has it), so the parts still add up to `offload_s`.
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shared.cluster import ClusterSpec, load_cluster
from shared.sim.offload_state import OffloadState
from shared.speeds import speed_of

__all__ = ["Breakdown", "JobParts", "breakdown", "main"]


@dataclass
class JobParts:
    job_id: str
    group: str  # node group of its first node
    gpus: int
    offload_s: float  # as the CSV says
    alone: float = 0.0
    at_start: float = 0.0
    later: float = 0.0
    alone_best: float | None = None  # single-node: alone cost on its cheapest group

    @property
    def total(self) -> float:
        return self.alone + self.at_start + self.later


@dataclass
class Breakdown:
    jobs: list[JobParts] = field(default_factory=list)

    def sums(self, key: Callable[[JobParts], str]) -> dict[str, tuple[int, float, float, float]]:
        """key -> (jobs, alone, at start, later), seconds."""
        out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for j in self.jobs:
            acc = out[key(j)]
            acc[0] += 1
            acc[1] += j.alone
            acc[2] += j.at_start
            acc[3] += j.later
        return {k: (int(v[0]), v[1], v[2], v[3]) for k, v in out.items()}

    def top_share(self, fraction: float = 0.1) -> float:
        """Share of all migration time lost by the `fraction` of jobs that lose most."""
        losses = sorted((j.total for j in self.jobs), reverse=True)
        total = sum(losses)
        return sum(losses[: max(1, int(len(losses) * fraction))]) / total if total else 0.0


def _group(node_id: str) -> str:
    return node_id.rsplit("-", 1)[0]


def breakdown(cluster: ClusterSpec, rows: list[dict[str, str]]) -> Breakdown:
    """The split of every offloading row (a segment: re-placed jobs have several)."""
    st = OffloadState(cluster)
    parts: dict[int, list[tuple[int, int]]] = {}
    out: dict[int, JobParts] = {}
    events: list[tuple[float, int, int]] = []
    begin: dict[int, float] = {}  # segment -> when its progress starts (after a restore)
    for k, r in enumerate(rows):
        if not r["param_bytes"]:
            continue
        on = []
        for p in r["nodes"].split(";"):
            node_id, idx = p.split(":")
            on.append((st.index[node_id], len(idx.split("+"))))
        pbytes, gpus = int(r["param_bytes"]), int(r["num_gpus"])
        st.add_job(k, r["job_id"], pbytes, gpus)
        parts[k] = [(i, g) for i, g in on if st.moves(pbytes, gpus, i)]
        out[k] = JobParts(
            r["job_id"], _group(cluster.nodes[on[0][0]].node_id), gpus, float(r["offload_s"] or 0)
        )
        events += [(float(r["finish_s"]), 0, k), (float(r["start_s"]), 1, k)]
        begin[k] = float(r["start_s"]) + float(r.get("restart_s") or 0.0)
    events.sort()  # at one instant: finishes first, as the simulator frees GPUs first
    streams = [0] * len(cluster.nodes)
    on_node: list[set[int]] = [set() for _ in cluster.nodes]
    first: dict[int, set[int]] = {}  # job -> the offloading jobs on its nodes at its start
    running: set[int] = set()

    def slowdown(k: int, count: Mapping[int, int]) -> float:
        return max(st.cost(k, i, count[i]).slowdown for i, _ in parts[k])

    last = events[0][0] if events else 0.0
    started: list[int] = []  # at the current instant
    for n, (t, kind, k) in enumerate(events):
        prev, last = last, t
        for j in running if t > prev else ():
            dt = t - max(prev, begin[j])  # a restoring segment makes no progress
            if not parts[j] or dt <= 0:
                continue
            mine = dict(parts[j])
            now = {i: streams[i] for i in mine}
            met = {
                i: g + sum(dict(parts[o])[i] for o in on_node[i] & first[j])
                for i, g in mine.items()
            }
            f, fa = slowdown(j, now), slowdown(j, mine)
            fs = min(max(slowdown(j, met), fa), f)
            work = dt / f
            acc = out[j]
            acc.alone += work * (fa - 1)
            acc.at_start += work * (fs - fa)
            acc.later += work * (f - fs)
        if kind == 1:
            running.add(k)
            started.append(k)
            for i, g in parts[k]:
                streams[i] += g
                on_node[i].add(k)
        else:
            running.discard(k)
            for i, g in parts[k]:
                streams[i] -= g
                on_node[i].discard(k)
        if started and (n == len(events) - 1 or events[n + 1][0] > t):
            # jobs started at one instant (one placement round) were all there at the start
            for j in started:
                first[j] = set().union(*(on_node[i] for i, _ in parts[j]), ()) - {j}
            started = []
    _alone_best(cluster, st, rows, parts, out)
    return Breakdown(list(out.values()))


def _alone_best(
    cluster: ClusterSpec,
    st: OffloadState,
    rows: list[dict[str, str]],
    parts: dict[int, list[tuple[int, int]]],
    out: dict[int, JobParts],
) -> None:
    reps: dict[str, int] = {}
    for i, n in enumerate(cluster.nodes):
        reps.setdefault(_group(n.node_id), i)
    for k, p in out.items():
        r = rows[k]
        if ";" in r["nodes"]:
            continue
        here = st.index[r["nodes"].split(":")[0]]
        work = float(r["finish_s"]) - float(r["start_s"]) - p.offload_s
        work -= float(r.get("restart_s") or 0.0)
        ref = work * speed_of(cluster.nodes[here].gpu_type, cluster.speed)
        costs = []
        for i in reps.values():
            n = cluster.nodes[i]
            if n.gpus < p.gpus:
                continue
            f = st.cost(k, i, p.gpus).slowdown if st.moves(st.param_bytes[k], p.gpus, i) else 1.0
            costs.append(ref / speed_of(n.gpu_type, cluster.speed) * (f - 1))
        p.alone_best = min(costs) if costs else None


def _report(name: str, b: Breakdown) -> None:
    m = 1e6
    single = [j for j in b.jobs if j.alone_best is not None]
    print(
        f"{name}: {len(b.jobs)} offloading jobs, "
        f"migration {sum(j.total for j in b.jobs) / m:.2f} M s"
        f" (CSV {sum(j.offload_s for j in b.jobs) / m:.2f}; largest difference "
        f"{max((abs(j.total - j.offload_s) for j in b.jobs), default=0.0):.3g} s); "
        f"the top 10% of jobs lose {b.top_share():.0%} of it"
    )
    print(f"  {'group / GPUs':22} {'jobs':>5} {'alone':>8} {'at start':>9} {'later':>8}  (M s)")
    rows = b.sums(lambda j: "all") | b.sums(
        lambda j: f"{j.group} {'1' if j.gpus == 1 else '2+'} GPU"
    )
    for key in sorted(rows, key=lambda s: (s != "all", s)):
        n, a, s, later = rows[key]
        print(f"  {key:22} {n:5d} {a / m:8.2f} {s / m:9.2f} {later / m:8.2f}")
    print(
        f"  single-node jobs: alone where they ran {sum(j.alone for j in single) / m:.2f} M s, "
        f"on the cheapest group for each {sum(j.alone_best or 0.0 for j in single) / m:.2f} M s"
    )


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m bench.offload_breakdown CLUSTER.yaml JOBS.csv [JOBS.csv ...]",
              file=sys.stderr)  # fmt: skip
        return 2
    cluster = load_cluster(argv[0])
    for path in argv[1:]:
        with Path(path).open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        _report(path, breakdown(cluster, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
