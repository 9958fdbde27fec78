"""What-if scenarios: the same trace under variants of the cluster, its queues, the
arrivals or the scheduler (`rltune whatif`). Pure logic: parse a variant, apply it
to a base scenario; the command runs each scenario through the one simulator.

A variant is a comma-separated list of KEY=VALUE changes, all applied together:

- `policy=NAME`, `placer=NAME`: which job goes next, where it goes;
- `discipline=strict|best-effort|easy`: what a blocked head does to the jobs
  behind it; `window=K`: jobs handed to placement per round;
- `load=L`: arrivals compressed (or stretched) to offered load L of *this
  scenario's* cluster (`shared.sim.load`);
- `scale=F`: every node shape's count times F, rounded (at least one node);
- `nodes.TYPE=+N|-N|N|xF|+NxG`: nodes of GPU type TYPE added, removed, set or
  scaled; `+NxG` adds N nodes of G GPUs each (also a type the cluster lacks);
- `speed.TYPE=S`: that GPU type's speed, relative to the reference;
- `queue.NAME.limit=G|none`, `queue.NAME.guaranteed=G`, `queue.NAME.weight=W`:
  a queue's (VC's) cap on GPUs held at once, guaranteed share and weight (the
  last two are what `drf` reads);
- `drop-vc=A+B`: those VCs' jobs taken out of the trace.

Nodes are grouped by shape (GPU type, GPUs per node, links, memory); removing
nodes removes the last of a shape, adding appends nodes named `<shape's first
node>-whatif-<i>`. Every problem is a `UserError` naming the change.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from shared.cluster import ClusterSpec, NodeSpec, QueueSpec
from shared.errors import UserError
from shared.placement_api import DISCIPLINES
from shared.traces import TraceJob

__all__ = ["KEYS", "Scenario", "apply", "parse_variant", "scenario_jobs"]

KEYS = (
    "policy", "placer", "discipline", "window", "load", "scale", "nodes.TYPE", "speed.TYPE",
    "queue.NAME.limit", "queue.NAME.guaranteed", "queue.NAME.weight", "drop-vc",
)  # fmt: skip
_QUEUE_FIELDS = {"limit": "limit_gpus", "guaranteed": "guaranteed_gpus", "weight": "weight"}


@dataclass(frozen=True)
class Scenario:
    """Everything a run depends on that a variant can change."""

    cluster: ClusterSpec
    policy: str
    placer: str
    discipline: str = "easy"
    window: int = 128
    load: float | None = None  # compress arrivals to this offered load; None: as traced
    drop_vcs: frozenset[str] = frozenset()
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
    return dataclasses.replace(s, changes=(*base.changes, *changes))


def scenario_jobs(jobs: Sequence[TraceJob], s: Scenario) -> list[TraceJob]:
    """The trace as scenario `s` runs it: dropped VCs out, arrivals compressed."""
    from shared.sim.load import compress_to_load

    out = [j for j in jobs if j.vc not in s.drop_vcs] if s.drop_vcs else list(jobs)
    missing = sorted(s.drop_vcs - {j.vc for j in jobs})
    if missing:
        vcs = sorted({j.vc for j in jobs})
        some = ", ".join(vcs[:12]) + (f" ... ({len(vcs)} in all)" if len(vcs) > 12 else "")
        raise UserError(f"drop-vc: no job of VC {', '.join(missing)} in the trace (VCs: {some})")
    if not out:
        raise UserError(f"{s.label}: no job is left once drop-vc is applied")
    if s.load is not None:
        out, _ = compress_to_load(out, s.cluster, s.load)
    return out


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
        return dataclasses.replace(s, window=int(k))
    if key == "load":
        return dataclasses.replace(s, load=_number(where, value, positive=True))
    if key == "scale":
        return dataclasses.replace(s, cluster=_scale(s.cluster, _number(where, value, True)))
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
            return dataclasses.replace(s, cluster=_queue(s.cluster, name, what, value, where))
    raise UserError(f"--vary: unknown key {key!r} (keys: {', '.join(KEYS)})")


def _number(where: str, value: str, positive: bool = False) -> float:
    try:
        x = float(value)
    except ValueError:
        raise UserError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(x) or (positive and x <= 0) or x < 0:
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


def _scale(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    have = Counter(_shape(n) for n in cluster.nodes)
    want = {k: round(c * factor) for k, c in have.items()}
    if sum(want.values()) == 0:
        biggest = max(have, key=lambda k: have[k])
        want[biggest] = 1
    return dataclasses.replace(cluster, nodes=tuple(_resize(cluster.nodes, want)))


def _nodes(cluster: ClusterSpec, gpu_type: str, value: str, where: str) -> ClusterSpec:
    of_type = [n for n in cluster.nodes if n.gpu_type == gpu_type]
    have = Counter(_shape(n) for n in of_type)
    v = value.replace(" ", "")
    if v.startswith("+") and "x" in v:  # +NxG: N new nodes of G GPUs of this type
        count_s, _, gpus_s = v[1:].partition("x")
        count, gpus = int(_number(where, count_s)), int(_number(where, gpus_s, positive=True))
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
    return dataclasses.replace(cluster, nodes=tuple(_resize(cluster.nodes, want)))


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
        q = dataclasses.replace(q, **{attr: _number(where, value, positive=what == "weight")})
    queues = {**cluster.queues, name: q}
    return dataclasses.replace(cluster, queues=MappingProxyType(queues))
