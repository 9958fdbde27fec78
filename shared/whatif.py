"""What-if scenarios: the same trace under variants of the cluster, its queues, the
arrivals or the scheduler (`rltune whatif`). Pure logic: parse a variant, apply it
to a base scenario; the command runs each scenario through the one simulator.

A variant is a comma-separated list of KEY=VALUE changes, all applied together:

- `policy=NAME`, `placer=NAME`: which job goes next, where it goes;
- `discipline=strict|best-effort|easy`: what a blocked head does to the jobs
  behind it; `window=K`: jobs handed to placement per round;
- `load=L`: arrivals compressed (or stretched) to offered load L of *this
  scenario's* cluster (`shared.sim.load`); without it a scenario replays the base's
  arrivals (which the command compresses once, for the base's cluster, given `--load`);
- `scale=F`: every node shape's count times F, rounded (at least one node);
- `nodes.TYPE=+N|-N|N|xF|+NxG`: nodes of GPU type TYPE added, removed, set or
  scaled; `+NxG` adds N nodes of G GPUs each (also a type the cluster lacks);
- `speed.TYPE=S`: the speed of a GPU type the scenario's cluster has. The trace's
  durations stay anchored to the *base's* reference speed: a job runs on type t for
  duration x base reference speed / t's speed in the scenario, so slowing the
  reference type itself slows the jobs on it (see `_anchored`);
- `queue.NAME.limit=G|none`, `queue.NAME.guaranteed=G`, `queue.NAME.weight=W`:
  a queue's (VC's) cap on GPUs held at once, guaranteed share and weight (the
  last two are what `drf` reads); NAME is a queue of the cluster, `default` or a VC
  of the trace (checked by `scenario_jobs`, which has the trace);
- `drop-vc=A+B`: those VCs' jobs taken out of the trace.

Nodes are grouped by shape (GPU type, GPUs per node, links, memory); removing
nodes removes the last of a shape, adding appends nodes named `<shape's first
node>-whatif-<i>`; a cluster of more than `MAX_GPUS` GPUs is refused before it is
built. Every problem (a non-finite number too) is a `UserError` naming the change.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

from shared.cluster import DEFAULT_QUEUE, ClusterSpec, NodeSpec, QueueSpec
from shared.errors import UserError
from shared.placement_api import DISCIPLINES
from shared.speeds import speed_of
from shared.traces import TraceJob

__all__ = ["KEYS", "MAX_GPUS", "PINNED", "Scenario", "apply", "parse_variant", "scenario_jobs"]

KEYS = (
    "policy", "placer", "discipline", "window", "load", "scale", "nodes.TYPE", "speed.TYPE",
    "queue.NAME.limit", "queue.NAME.guaranteed", "queue.NAME.weight", "drop-vc",
)  # fmt: skip
_QUEUE_FIELDS = {"limit": "limit_gpus", "guaranteed": "guaranteed_gpus", "weight": "weight"}
MAX_GPUS = 1_000_000  # a scenario's cluster may have at most this many GPUs
MAX_WINDOW = 1_000_000_000
PINNED = "@base"  # suffix of a scenario's reference pinned at the base's reference speed


@dataclass(frozen=True)
class Scenario:
    """Everything a run depends on that a variant can change."""

    cluster: ClusterSpec
    policy: str
    placer: str
    discipline: str = "easy"
    window: int = 128
    load: float | None = None  # `load=L`: arrivals compressed to L; None: the base's
    drop_vcs: frozenset[str] = frozenset()
    new_queues: frozenset[str] = frozenset()  # queues a change created (checked on the trace)
    changes: tuple[tuple[str, str], ...] = field(default=())  # what made it from the base

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.changes) or "base"


def parse_variant(text: str) -> list[tuple[str, str]]:
    """`"nodes.V100=+8,policy=drf"` -> [("nodes.V100", "+8"), ("policy", "drf")]."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise UserError(f"--vary {text!r}: {part!r} is not KEY=VALUE (keys: {', '.join(KEYS)})")
        out.append((key, value))
    if not out:
        raise UserError(f"--vary {text!r}: no change given (KEY=VALUE, comma-separated)")
    return out


def apply(base: Scenario, changes: Sequence[tuple[str, str]]) -> Scenario:
    """`base` with every change applied, in order."""
    s = base
    for key, value in changes:
        s = _apply_one(s, key, value)
    if s.cluster.total_gpus <= 0:
        raise UserError(f"--vary {_text(changes)}: the cluster would have no GPUs")
    types = s.cluster.gpu_types
    for key, value in changes:
        if key.startswith("speed.") and key[6:] not in types:
            raise UserError(
                f"--vary {key}={value}: the scenario's cluster has no {key[6:]} GPUs "
                f"(types: {', '.join(types)})"
            )
    cluster = _anchored(base.cluster, s.cluster)
    return dataclasses.replace(s, cluster=cluster, changes=(*base.changes, *changes))


def _anchored(base: ClusterSpec, cluster: ClusterSpec) -> ClusterSpec:
    """`cluster` with the trace's durations anchored to `base`'s reference speed.

    The simulator (and `offered_load`) run a job on type t for duration x
    speed(reference) / speed(t), both read from the cluster's speed table, so a change
    of the reference type's own speed would move the anchor with it: halving P100, the
    reference, would leave P100 jobs as fast as before and make every other type look
    twice as fast. Then the reference becomes `<TYPE>@base`, a type no node has, at
    the base's reference speed; every real type keeps the speed it was given."""
    ref = base.reference
    if ref is None:  # durations are at speed 1.0, which no change moves
        return cluster
    anchor = speed_of(ref, base.speed)
    if cluster.reference == ref and speed_of(ref, cluster.speed) == anchor:
        return cluster
    pinned = ref if ref.endswith(PINNED) else f"{ref}{PINNED}"
    speed = {**cluster.speed, pinned: anchor}
    return dataclasses.replace(cluster, speed=MappingProxyType(speed), reference=pinned)


def scenario_jobs(jobs: Sequence[TraceJob], s: Scenario, basis: str = "offered") -> list[TraceJob]:
    """The trace as scenario `s` runs it: dropped VCs out; arrivals compressed if the
    scenario has its own `load=` (a value of `basis`, as `--load-basis`), else as given
    (the base's). A dropped VC, or a queue a change named, that is neither in the
    cluster nor in the trace is refused."""
    from shared.sim.load import compress_to_load

    out = [j for j in jobs if j.vc not in s.drop_vcs] if s.drop_vcs else list(jobs)
    vcs = {j.vc for j in jobs}
    missing = sorted(s.drop_vcs - vcs)
    if missing:
        raise UserError(
            f"drop-vc: no job of VC {', '.join(missing)} in the trace (VCs: {_some(vcs)})"
        )
    unknown = sorted(s.new_queues - vcs - {DEFAULT_QUEUE})
    if unknown:
        queues = sorted((set(s.cluster.queues) - s.new_queues) | {DEFAULT_QUEUE})
        key, value = next((k, v) for k, v in s.changes if k.startswith(f"queue.{unknown[0]}."))
        raise UserError(
            f"--vary {key}={value}: no queue or VC {', '.join(unknown)} in the cluster or the "
            f"trace (queues: {', '.join(queues)}; VCs: {_some(vcs)})"
        )
    if not out:
        raise UserError(f"{s.label}: no job is left once drop-vc is applied")
    if s.load is not None:
        out, _ = compress_to_load(out, s.cluster, s.load, basis)
    return out


def _some(names: set[str]) -> str:
    vcs = sorted(names)
    return ", ".join(vcs[:12]) + (f" ... ({len(vcs)} in all)" if len(vcs) > 12 else "")


# ---- one change -------------------------------------------------------------------------


def _apply_one(s: Scenario, key: str, value: str) -> Scenario:
    where = f"--vary {key}={value}"
    if key == "policy":  # (names are checked by the command, before any run)
        return dataclasses.replace(s, policy=value)
    if key == "placer":
        return dataclasses.replace(s, placer=value)
    if key == "discipline":
        if value not in DISCIPLINES:
            raise UserError(f"{where}: give one of {', '.join(DISCIPLINES)}")
        return dataclasses.replace(s, discipline=value)
    if key == "window":
        k = _number(where, value, positive=True)
        if k != int(k):
            raise UserError(f"{where}: a window is a whole number of jobs")
        if k > MAX_WINDOW:
            raise UserError(f"{where}: give a window of at most {MAX_WINDOW:,} jobs")
        return dataclasses.replace(s, window=int(k))
    if key == "load":
        return dataclasses.replace(s, load=_number(where, value, positive=True))
    if key == "scale":
        cluster = _scale(s.cluster, _number(where, value, positive=True), where)
        return dataclasses.replace(s, cluster=cluster)
    if key == "drop-vc":
        return dataclasses.replace(s, drop_vcs=s.drop_vcs | {v for v in value.split("+") if v})
    head, _, rest = key.partition(".")
    if head == "nodes" and rest:
        return dataclasses.replace(s, cluster=_nodes(s.cluster, rest, value, where))
    if head == "speed" and rest:
        speed = dict(s.cluster.speed)
        speed[rest] = _number(where, value, positive=True)
        cluster = dataclasses.replace(s.cluster, speed=MappingProxyType(speed))
        return dataclasses.replace(s, cluster=cluster)
    if head == "queue" and rest.count(".") >= 1:
        name, _, what = rest.rpartition(".")
        if what in _QUEUE_FIELDS:
            new = s.new_queues | ({name} - set(s.cluster.queues))
            cluster = _queue(s.cluster, name, what, value, where)
            return dataclasses.replace(s, cluster=cluster, new_queues=new)
    raise UserError(f"--vary: unknown key {key!r} (keys: {', '.join(KEYS)})")


def _number(where: str, value: str, positive: bool = False) -> float:
    try:
        x = float(value)
    except ValueError:
        raise UserError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise UserError(f"{where}: {value!r} is not a finite number")
    if (positive and x <= 0) or x < 0:
        raise UserError(f"{where}: give a {'positive' if positive else 'non-negative'} number")
    return x


def _text(changes: Sequence[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in changes)


def _shape(n: NodeSpec) -> tuple[object, ...]:
    return (n.gpu_type, n.gpus, n.pcie_gbps, n.nvme_gbps, n.host_mem_gib, n.cpu_milli)


def _resize(nodes: Sequence[NodeSpec], want: dict[tuple[object, ...], int]) -> list[NodeSpec]:
    """`nodes` with each shape's count set to `want[shape]` (the last ones removed, new
    ones appended after the shape's last node)."""
    have = Counter(_shape(n) for n in nodes)
    last = {_shape(n): i for i, n in enumerate(nodes)}
    first = {_shape(n): n for n in reversed(nodes)}
    taken: Counter[tuple[object, ...]] = Counter()
    out: list[NodeSpec] = []
    ids = {n.node_id for n in nodes}
    for i, n in enumerate(nodes):
        k = _shape(n)
        if taken[k] < want.get(k, have[k]):
            out.append(n)
        taken[k] += 1
        if i == last[k] and want.get(k, have[k]) > have[k]:
            out += _new_nodes(first[k], want[k] - have[k], ids)
    return out


def _new_nodes(like: NodeSpec, count: int, ids: set[str]) -> list[NodeSpec]:
    out: list[NodeSpec] = []
    i = 0
    while len(out) < count:
        node_id = f"{like.node_id}-whatif-{i}"
        i += 1
        if node_id not in ids:
            ids.add(node_id)
            out.append(dataclasses.replace(like, node_id=node_id))
    return out


def _scale(cluster: ClusterSpec, factor: float, where: str) -> ClusterSpec:
    have = Counter(_shape(n) for n in cluster.nodes)
    want = {k: round(c * factor) for k, c in have.items()}
    if sum(want.values()) == 0:
        biggest = max(have, key=lambda k: have[k])
        want[biggest] = 1
    _check_size(where, sum(_gpus(k) * c for k, c in want.items()))
    return dataclasses.replace(cluster, nodes=tuple(_resize(cluster.nodes, want)))


def _nodes(cluster: ClusterSpec, gpu_type: str, value: str, where: str) -> ClusterSpec:
    of_type = [n for n in cluster.nodes if n.gpu_type == gpu_type]
    have = Counter(_shape(n) for n in of_type)
    v = value.replace(" ", "")
    if v.startswith("+") and "x" in v:  # +NxG: N new nodes of G GPUs of this type
        count_s, _, gpus_s = v[1:].partition("x")
        count, gpus = _number(where, count_s), _number(where, gpus_s, positive=True)
        if count != int(count) or gpus != int(gpus):
            raise UserError(f"{where}: +NxG takes whole numbers of nodes and of GPUs per node")
        count, gpus = int(count), int(gpus)
        _check_size(where, cluster.total_gpus + count * gpus)
        like = of_type[0] if of_type else NodeSpec(f"{gpu_type.lower()}", gpu_type, gpus)
        like = dataclasses.replace(like, gpus=gpus)
        ids = {n.node_id for n in cluster.nodes}
        return dataclasses.replace(cluster, nodes=(*cluster.nodes, *_new_nodes(like, count, ids)))
    if not of_type:
        raise UserError(
            f"{where}: the cluster has no {gpu_type} nodes to copy; give +NxG "
            f"(N nodes of G GPUs each), e.g. nodes.{gpu_type}=+4x8"
        )
    total = sum(have.values())
    if v.startswith("x"):
        factor = _number(where, v[1:])
        want = {k: round(c * factor) for k, c in have.items()}
    else:
        n = _number(where, v.lstrip("+-"))
        if n != int(n):
            raise UserError(f"{where}: a node count is a whole number")
        target = total + int(n) if v[0] == "+" else total - int(n) if v[0] == "-" else int(n)
        if target < 0:
            raise UserError(f"{where}: the cluster has only {total} {gpu_type} nodes")
        want = _spread(have, target)
    now = sum(_gpus(k) * c for k, c in have.items())
    _check_size(where, cluster.total_gpus - now + sum(_gpus(k) * c for k, c in want.items()))
    return dataclasses.replace(cluster, nodes=tuple(_resize(cluster.nodes, want)))


def _gpus(shape: tuple[object, ...]) -> int:
    return cast(int, shape[1])  # (see `_shape`)


def _check_size(where: str, gpus: int) -> None:
    """Refuse a cluster too large to simulate, before its nodes are built."""
    if gpus > MAX_GPUS:
        raise UserError(
            f"{where}: the scenario's cluster would have {gpus:,} GPUs; at most {MAX_GPUS:,}"
        )


def _spread(have: Counter[tuple[object, ...]], target: int) -> dict[tuple[object, ...], int]:
    """`target` nodes over a type's shapes in proportion to their counts (largest
    remainders; ties to the most common shape)."""
    total = sum(have.values())
    exact = {k: c * target / total for k, c in have.items()}
    want = {k: math.floor(x) for k, x in exact.items()}
    order = sorted(have, key=lambda k: (-(exact[k] - want[k]), -have[k]))
    for k in order[: target - sum(want.values())]:
        want[k] += 1
    return want


def _queue(cluster: ClusterSpec, name: str, what: str, value: str, where: str) -> ClusterSpec:
    q = cluster.queues.get(name, QueueSpec())
    attr = _QUEUE_FIELDS[what]
    if what == "limit" and value.lower() == "none":
        q = dataclasses.replace(q, limit_gpus=None)
    else:
        number = _number(where, value, positive=what == "weight")
        if attr == "limit_gpus":
            q = dataclasses.replace(q, limit_gpus=number)
        elif attr == "guaranteed_gpus":
            q = dataclasses.replace(q, guaranteed_gpus=number)
        else:
            q = dataclasses.replace(q, weight=number)
    if what == "guaranteed":  # a number now: for any GPU type, not per type any more
        q = dataclasses.replace(q, guaranteed_by_type=MappingProxyType({}))
    queues = {**cluster.queues, name: q}
    return dataclasses.replace(cluster, queues=MappingProxyType(queues))
