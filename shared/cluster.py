"""Cluster specs: the YAML of DESIGN.md, or an Alibaba `openb_node_list_*.csv` as is.

    name: example
    speed: {V100: 1.0, P100: 0.55}     # optional; defaults in shared.speeds
    reference: P100                     # type the trace's durations were measured on
    nodes:
      - {name: v100, count: 28, gpu_type: V100, gpus: 8}
    queues:
      research: {guaranteed_gpus: 96, limit_gpus: 160}          # an org
      "nlp": {parent: research, guaranteed_gpus: {V100: 32}, limit_gpus: 64, weight: 1}
    priority_preemption: false          # optional; every class's `preempt_lower` default
    priority_classes:
      inference: {priority: 100, preemptible: false, preempt_lower: true}
      train: {priority: 10, preemptible: true, checkpoint_s: 1800}
    fair_share: {half_life_h: 168}      # decay of the usage behind fair share (shared/fairshare.py)

A node group `{name: v100, count: 28}` becomes nodes `v100-0` .. `v100-27`.

Queues form at most two levels: a queue names its org as `parent`, and an org
has no parent. `guaranteed_gpus` is a number (GPUs of any type) or a mapping
GPU type -> GPUs (`QueueSpec.guaranteed_gpus` is then the total and
`guaranteed_by_type` the mapping); `limit_gpus` is a number (any type). A
promise must be keepable, so: a team's guarantee (and its teams' together) is
at most its org's, and the top-level guarantees together (per type where typed)
at most what the cluster has. What the rules do with these numbers:
shared/tenancy.py.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from shared.errors import UserError
from shared.speeds import DEFAULT_SPEEDS, default_speed

__all__ = [
    "ClusterSpec", "NodeSpec", "PriorityClass", "QueueSpec", "load_cluster", "parse_cluster",
]  # fmt: skip

DEFAULT_QUEUE = "default"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    node_id: str
    gpu_type: str
    gpus: int
    pcie_gbps: float = 16.0
    nvme_gbps: float = 3.0
    host_mem_gib: float = 256.0
    cpu_milli: int = 0


@dataclass(frozen=True, slots=True)
class QueueSpec:
    guaranteed_gpus: float = 0.0
    limit_gpus: float | None = None
    weight: float = 1.0
    parent: str | None = None  # its org (a top-level queue), or None: it is top-level
    # per GPU type, when given as a mapping (empty: the number is for any type)
    guaranteed_by_type: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PriorityClass:
    priority: int = 0  # higher = more important
    preemptible: bool = True  # False: never preempted (and may start only within guarantee)
    checkpoint_s: float | None = None  # checkpoint interval (restart cost); None: the default
    # a waiting job of this class that does not fit may preempt its own queue's jobs of
    # lower classes (shared/tenancy.py rule 5); the file's `priority_preemption` if unset
    preempt_lower: bool = False


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    speed: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    reference: str | None = None
    queues: Mapping[str, QueueSpec] = field(default_factory=lambda: MappingProxyType({}))
    priority_classes: Mapping[str, PriorityClass] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # the half-life of the decayed usage fair share reads (`fair_share: {half_life_h}`)
    half_life_s: float = 7 * 86400.0

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({n.gpu_type for n in self.nodes}))

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.gpu_type] = out.get(n.gpu_type, 0) + n.gpus
        return out

    def max_node_gpus(self, gpu_type: str | None = None) -> int:
        return max(
            (n.gpus for n in self.nodes if gpu_type is None or n.gpu_type == gpu_type), default=0
        )

    def queue_of(self, vc: str) -> str:
        """The queue a VC's jobs fall into (its own, else `default`)."""
        return vc if vc in self.queues else DEFAULT_QUEUE


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster spec from YAML, or from an Alibaba openb node list CSV."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"cluster file {p} is a directory: give a YAML file or an openb CSV")
    if not p.is_file():
        raise UserError(f"cluster file not found: {p}")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read cluster file {p}: {exc}") from exc
    if p.suffix.lower() == ".csv":
        return _parse_openb_csv(text, name=p.stem, source=str(p))
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"cluster file {p} is not valid YAML: {_yaml_problem(exc)}") from exc
    return parse_cluster(data, source=str(p))


_TOP_KEYS = (
    "name", "nodes", "speed", "reference", "queues", "priority_classes", "priority_preemption",
    "fair_share",
)  # fmt: skip
_FAIR_SHARE_KEYS = ("half_life_h",)
_NODE_KEYS = ("name", "gpu_type", "count", "gpus", "pcie_gbps", "nvme_gbps", "host_mem_gib")
_QUEUE_KEYS = ("guaranteed_gpus", "limit_gpus", "weight", "parent")
_CLASS_KEYS = ("priority", "preemptible", "checkpoint_s", "preempt_lower")


def _known_keys(raw: dict[Any, Any], allowed: tuple[str, ...], where: str) -> None:
    """A key the spec does not define (a typo: `speeds`, `gpu`, `limit`) would be
    ignored silently and change the run; it is refused by name."""
    for k in raw:
        if k not in allowed:
            raise UserError(f"{where}: unknown key {k!r}; the keys are {', '.join(allowed)}")


def parse_cluster(data: Any, source: str = "<cluster>") -> ClusterSpec:
    """Build a ClusterSpec from the parsed YAML mapping; errors name the field."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: a cluster spec is a mapping with a `nodes` list")
    _known_keys(data, _TOP_KEYS, source)
    groups = data.get("nodes")
    if not isinstance(groups, list) or not groups:
        raise UserError(f"{source}: `nodes` must be a non-empty list")
    nodes: list[NodeSpec] = []
    for i, g in enumerate(groups):
        nodes.extend(_node_group(g, f"{source}: nodes[{i}]"))
    seen: set[str] = set()
    for n in nodes:
        if n.node_id in seen:
            raise UserError(f"{source}: node name {n.node_id!r} appears twice")
        seen.add(n.node_id)
    if sum(n.gpus for n in nodes) == 0:
        raise UserError(f"{source}: the cluster has no GPUs")
    types = {n.gpu_type for n in nodes}
    speed = _speeds(data.get("speed") or {}, types, source)
    reference = data.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise UserError(f"{source}: `reference` must be a GPU type name")
    # run times are scaled by speed ratios: a type of unknown speed would silently
    # run as fast as a P100 (speed 1.0). One type alone, with no reference, needs none.
    named = types | ({reference} if reference is not None else set())
    unknown = sorted(t for t in named if t not in speed and default_speed(t) is None)
    if unknown and (len(types) > 1 or reference is not None):
        known = ", ".join(sorted(DEFAULT_SPEEDS))
        raise UserError(
            f"{source}: no speed known for GPU type {', '.join(unknown)}: give it under "
            f"`speed:` (relative throughput, P100 = 1.0; built in: {known})"
        )
    queues = _queues(data.get("queues") or {}, source)
    _check_tree(queues, nodes, source)
    every = data.get("priority_preemption", False)
    if not isinstance(every, bool):
        raise UserError(f"{source}: `priority_preemption` must be true or false, got {every!r}")
    classes = _priority_classes(data.get("priority_classes") or {}, source, every)
    half_life_s = _half_life(data.get("fair_share") or {}, source)
    return ClusterSpec(
        name=str(data.get("name") or Path(source).stem),
        nodes=tuple(nodes),
        speed=MappingProxyType(speed),
        reference=reference,
        queues=MappingProxyType(queues),
        priority_classes=MappingProxyType(classes),
        half_life_s=half_life_s,
    )


def _half_life(raw: Any, source: str) -> float:
    """`fair_share: {half_life_h: H}`: seconds (default 7 days, Slurm's
    PriorityDecayHalfLife)."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: `fair_share` must be a mapping like {{half_life_h: 168}}")
    _known_keys(raw, _FAIR_SHARE_KEYS, f"{source}: fair_share")
    h = raw.get("half_life_h", 168)
    if not _positive(h):
        raise UserError(f"{source}: fair_share.half_life_h must be a positive number, got {h!r}")
    return float(h) * 3600.0


def _node_group(g: Any, where: str) -> list[NodeSpec]:
    if not isinstance(g, dict):
        raise UserError(f"{where}: expected a mapping like {{name: v100, count: 8, ...}}")
    _known_keys(g, _NODE_KEYS, where)
    name = g.get("name")
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}: `name` must be a non-empty string")
    gpu_type = g.get("gpu_type")
    if not isinstance(gpu_type, str) or not gpu_type:
        raise UserError(f"{where}: `gpu_type` must be a non-empty string")
    count = _int_field(g, "count", where, default=1, lo=1)
    gpus = _int_field(g, "gpus", where, default=None, lo=0)
    extra = {
        k: _float_field(g, k, where)
        for k in ("pcie_gbps", "nvme_gbps", "host_mem_gib")
        if g.get(k) is not None
    }
    ids = [name] if count == 1 and g.get("count") is None else [f"{name}-{i}" for i in range(count)]
    return [
        NodeSpec(
            node_id=i,
            gpu_type=gpu_type,
            gpus=gpus,
            pcie_gbps=extra.get("pcie_gbps", 16.0),
            nvme_gbps=extra.get("nvme_gbps", 3.0),
            host_mem_gib=extra.get("host_mem_gib", 256.0),
        )
        for i in ids
    ]


def _int_field(g: dict[str, Any], key: str, where: str, default: int | None, lo: int) -> int:
    v = g.get(key, default)
    if v is None:
        raise UserError(f"{where}: `{key}` is required")
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise UserError(f"{where}: `{key}` must be an integer >= {lo}, got {v!r}")
    return v


def _float_field(g: dict[str, Any], key: str, where: str) -> float:
    v = g[key]
    if not _positive(v):
        raise UserError(f"{where}: `{key}` must be a positive number, got {v!r}")
    return float(v)


def _positive(v: Any) -> bool:
    """A finite number > 0 (not a bool; NaN and infinity are not)."""
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and v > 0


def _speeds(raw: Any, types: set[str], source: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise UserError(f"{source}: `speed` must map GPU type to a positive number")
    out = {t: v for t in types if (v := default_speed(t)) is not None}
    for t, v in raw.items():
        if not _positive(v):
            raise UserError(f"{source}: speed.{t} must be a positive number, got {v!r}")
        out[str(t)] = float(v)
    return out


def _queues(raw: Any, source: str) -> dict[str, QueueSpec]:
    if not isinstance(raw, dict):
        raise UserError(f"{source}: `queues` must map a VC name to its limits")
    out: dict[str, QueueSpec] = {}
    for name, q in raw.items():
        where = f"{source}: queues.{name}"
        if not isinstance(q, dict):
            raise UserError(f"{where}: expected a mapping")
        _known_keys(q, _QUEUE_KEYS, where)
        vals: dict[str, Any] = {}
        for k in ("guaranteed_gpus", "limit_gpus", "weight"):
            v = q.get(k)
            if v is None:
                continue
            if isinstance(v, dict) and k == "guaranteed_gpus":
                per = {str(t): _gpus(n, f"{where}.{k}.{t}") for t, n in v.items()}
                vals[k.replace("_gpus", "_by_type")] = MappingProxyType(per)
                vals[k] = float(sum(per.values()))
                continue
            vals[k] = _gpus(v, f"{where}.{k}")
        low, high = vals.get("guaranteed_gpus"), vals.get("limit_gpus")
        if low is not None and high is not None and low > high:
            raise UserError(f"{where}: guaranteed_gpus {low:g} is more than limit_gpus {high:g}")
        parent = q.get("parent")
        if parent is not None:
            if not isinstance(parent, str) or not parent:
                raise UserError(f"{where}.parent must be a queue name, got {parent!r}")
            vals["parent"] = parent
        out[str(name)] = QueueSpec(**vals)
    return out


def _gpus(v: Any, where: str) -> float:
    if not ((v == 0 and not isinstance(v, bool)) or _positive(v)):
        raise UserError(f"{where} must be a number >= 0, got {v!r}")
    return float(v)


def _check_tree(queues: Mapping[str, QueueSpec], nodes: list[NodeSpec], source: str) -> None:
    """Two levels at most, and guarantees the cluster (and each org) can keep."""
    types = sorted({n.gpu_type for n in nodes})
    have: dict[str, float] = {}
    for n in nodes:
        have[n.gpu_type] = have.get(n.gpu_type, 0.0) + n.gpus
    for name, q in queues.items():
        where = f"{source}: queues.{name}"
        for t in q.guaranteed_by_type:
            if t not in have:
                raise UserError(
                    f"{where}.guaranteed_gpus.{t}: no GPU type {t!r} in the cluster "
                    f"(types: {', '.join(types)})"
                )
        if q.parent is None:
            continue
        org = queues.get(q.parent)
        if org is None or q.parent == name:
            raise UserError(f"{where}.parent: {q.parent!r} is not another queue of `queues`")
        if org.parent is not None:
            raise UserError(
                f"{where}.parent: {q.parent!r} has a parent itself ({org.parent!r}); "
                "queues form at most two levels (org, then team)"
            )
        if q.guaranteed_gpus > org.guaranteed_gpus:
            raise UserError(
                f"{where}.guaranteed_gpus {q.guaranteed_gpus:g} is more than its org "
                f"{q.parent}'s guaranteed_gpus {org.guaranteed_gpus:g}"
            )
    for org_name, org in queues.items():
        teams = [(n, q) for n, q in queues.items() if q.parent == org_name]
        total = sum(q.guaranteed_gpus for _, q in teams)
        if teams and total > org.guaranteed_gpus + 1e-9:
            listed = " + ".join(f"{n} {q.guaranteed_gpus:g}" for n, q in teams)
            raise UserError(
                f"{source}: queues.{org_name}.guaranteed_gpus {org.guaranteed_gpus:g} is less "
                f"than its teams' guarantees together ({listed})"
            )
    tops = [q for q in queues.values() if q.parent is None]
    total = sum(q.guaranteed_gpus for q in tops)
    if total > sum(have.values()) + 1e-9:
        raise UserError(
            f"{source}: queues: the top-level guaranteed_gpus add up to {total:g}, more than "
            f"the cluster's {sum(have.values()):g} GPUs"
        )
    for t, count in have.items():
        typed = sum(q.guaranteed_by_type.get(t, 0.0) for q in tops)
        if typed > count + 1e-9:
            raise UserError(
                f"{source}: queues: the top-level guaranteed_gpus.{t} add up to {typed:g}, "
                f"more than the cluster's {count:g} {t} GPUs"
            )


def _priority_classes(raw: Any, source: str, every: bool = False) -> dict[str, PriorityClass]:
    if not isinstance(raw, dict):
        raise UserError(f"{source}: `priority_classes` must map a name to its priority")
    out: dict[str, PriorityClass] = {}
    for name, c in raw.items():
        where = f"{source}: priority_classes.{name}"
        if not isinstance(c, dict):
            raise UserError(f"{where}: expected a mapping like {{priority: 10, preemptible: true}}")
        _known_keys(c, _CLASS_KEYS, where)
        prio = c.get("priority", 0)
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise UserError(f"{where}.priority must be an integer, got {prio!r}")
        pre = c.get("preemptible", True)
        if not isinstance(pre, bool):
            raise UserError(f"{where}.preemptible must be true or false, got {pre!r}")
        ck = c.get("checkpoint_s")
        if ck is not None and not _positive(ck):
            raise UserError(f"{where}.checkpoint_s must be a positive number, got {ck!r}")
        low = c.get("preempt_lower", every)
        if not isinstance(low, bool):
            raise UserError(f"{where}.preempt_lower must be true or false, got {low!r}")
        out[str(name)] = PriorityClass(prio, pre, None if ck is None else float(ck), low)
    return out


def _parse_openb_csv(text: str, name: str, source: str) -> ClusterSpec:
    """Alibaba openb node list: `sn,cpu_milli,memory_mib,gpu,model`; CPU-only rows skipped."""
    rows = csv.DictReader(text.splitlines())
    need = {"sn", "gpu", "model"}
    if rows.fieldnames is None or not need <= set(rows.fieldnames):
        raise UserError(f"{source}: an openb node list needs columns {sorted(need)}")
    nodes: list[NodeSpec] = []
    for line, r in enumerate(rows, start=2):
        try:
            gpus = int(r["gpu"] or 0)
            mem = float(r.get("memory_mib") or 0) / 1024.0
            cpu = int(r.get("cpu_milli") or 0)
        except ValueError as exc:
            raise UserError(f"{source}:{line}: bad number ({exc})") from exc
        if gpus <= 0:
            continue
        nodes.append(
            NodeSpec(
                node_id=r["sn"],
                gpu_type=r["model"] or "unknown",
                gpus=gpus,
                host_mem_gib=mem or 256.0,
                cpu_milli=cpu,
            )
        )
    if not nodes:
        raise UserError(f"{source}: the cluster has no GPUs")
    types = {n.gpu_type for n in nodes}
    speed = {t: v for t in types if (v := default_speed(t)) is not None}
    return ClusterSpec(name=name, nodes=tuple(nodes), speed=MappingProxyType(speed))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error as one line: the problem and where (its own message spans lines
    with a caret under the offending character)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context}"
    return " ".join(str(exc).split())
