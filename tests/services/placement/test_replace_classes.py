"""replace.choose_move tests each node class once, on its first node that holds the
job. Against a reference written node by node (every free node tested, the first
of the best kept), over random instances: the same move, and the placer asked the
same questions. Nodes of one class give the same estimates, as in production
(offload_term.py's class is the GPU type, the node's GPU count and the signature the
estimate reads)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from random import Random

import pytest

from services.placement.replace import choose_move
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree
from shared.sched.replacement import Move, ReplaceConfig, RunningOffload, restart_cost_s

Estimate = Callable[[int, int, str, int], tuple[float, float]]
Place = Callable[[JobRequest, Sequence[NodeFree]], Allocation | None]


def passes(
    r: RunningOffload,
    parts: Sequence[tuple[str, int]],
    speed: Mapping[str, float],
    estimate: Estimate,
    before: float,
    cost: float,
    cfg: ReplaceConfig,
    slowest: str,
) -> tuple[float, float] | None:
    """The module doc's test: (after, saved) if the move passes, else None."""
    s = speed.get(slowest, 1.0)
    g = r.job.num_gpus
    own = max(estimate(r.param_bytes, g, nid, take)[0] / s for nid, take in parts)
    caused = 0.0
    for nid, take in parts:
        caused += estimate(r.param_bytes, g, nid, take)[1] * take / g / s
    after = own + caused - r.relief / r.speed
    saved = (before - after) * cfg.expect * r.elapsed_s / before
    if own <= (1 - cfg.min_gain) * before and saved >= cfg.payback * cost:
        return after, saved
    return None


def reference(
    running: Sequence[RunningOffload],
    nodes: Sequence[NodeFree],
    speed: Mapping[str, float],
    cfg: ReplaceConfig,
    estimate: Estimate,
    place: Callable[[JobRequest, Sequence[NodeFree]], Allocation | None],
    klass: Callable[[NodeFree], Hashable],
) -> Move | None:
    """The module doc's decision, every free node tested in node order."""

    def whole(n: NodeFree) -> int:
        return sum(1 for f in n.free_milli if f >= FULL_GPU)

    for r in sorted(running, key=lambda r: (-r.elapsed_s, r.job.job_id)):
        if r.elapsed_s < max(cfg.min_run_s, cfg.after * r.est_run_s):
            continue
        before = r.slowdown / r.speed
        cost = restart_cost_s(r.param_bytes, cfg)
        g = r.job.num_gpus
        free = [n for n in nodes if n.node_id not in r.nodes and r.job.allows(n.gpu_type)]
        if sum(whole(n) for n in free) < g and r.job.gpu_milli >= FULL_GPU:
            continue
        holds = [n for n in free
                 if whole(n) >= g or (g == 1 and max(n.free_milli) >= r.job.gpu_milli)]  # fmt: skip
        if holds:
            best, best_saved = None, 0.0
            for n in holds:
                got = passes(r, [(n.node_id, g)], speed, estimate, before, cost, cfg, n.gpu_type)
                if got is not None and (best is None or got[1] > best_saved):
                    best, best_saved = n, got[1]
            if best is None:
                continue
            alloc = place(r.job, [n for n in holds if klass(n) == klass(best)])
        else:
            if not free:
                continue
            own = min(estimate(r.param_bytes, g, n.node_id, 1)[0] / speed.get(n.gpu_type, 1.0)
                      for n in free)  # fmt: skip
            saved = (before - own + r.relief / r.speed) * cfg.expect * r.elapsed_s / before
            if own > (1 - cfg.min_gain) * before or saved < cfg.payback * cost:
                continue
            alloc = place(r.job, free)
        if alloc is None:
            continue
        types = {n.node_id: n.gpu_type for n in free}
        parts = [(nid, len(idx)) for nid, idx in alloc.gpus]
        slowest = min((types[nid] for nid, _ in parts), key=lambda t: speed.get(t, 1.0))
        got = passes(r, parts, speed, estimate, before, cost, cfg, slowest)
        if got is None:
            continue
        return Move(r.job.job_id, alloc, cost, before, got[0], got[1])
    return None


def first_fit(job: JobRequest, nodes: Sequence[NodeFree]) -> Allocation | None:
    """A placer: the job's GPUs from the first nodes, in order (a share on the first
    GPU with room)."""
    if job.gpu_milli < FULL_GPU:
        for n in nodes:
            for g, f in enumerate(n.free_milli):
                if f >= job.gpu_milli:
                    return Allocation(job.job_id, ((n.node_id, (g,)),), job.gpu_milli)
        return None
    parts, need = [], job.num_gpus
    for n in nodes:
        idx = tuple(g for g, f in enumerate(n.free_milli) if f >= FULL_GPU)[:need]
        if idx:
            parts.append((n.node_id, idx))
            need -= len(idx)
        if need == 0:
            return Allocation(job.job_id, tuple(parts), FULL_GPU)
    return None


def instance(
    rng: Random,
) -> tuple[list[RunningOffload], list[NodeFree], dict[str, tuple[str, int, int]]]:
    """Random free nodes (two types, 1-8 GPUs, each GPU free, half free or taken;
    a signature label 0-2) and running jobs (whole GPUs or a 1-GPU share; some on
    free nodes, so those are not offered to them)."""
    nodes, label = [], {}
    for k in range(rng.randint(1, 24)):
        t = rng.choice(("P100", "V100"))
        size = rng.choice((1, 2, 4, 8))
        row = tuple(rng.choice((0, 500, 1000, 1000)) for _ in range(size))
        nid = f"n{k:02d}"
        nodes.append(NodeFree(nid, t, row))
        label[nid] = (t, size, rng.randrange(3))
    running = []
    for k in range(rng.randint(1, 6)):
        share = rng.random() < 0.2
        g = 1 if share else rng.choice((1, 1, 2, 4, 8))
        types = rng.choice((frozenset(), frozenset({"P100"}), frozenset({"V100"})))
        job = JobRequest(f"j{k}", g, rng.choice((300, 500)) if share else FULL_GPU, types,
                         1.0, 1.0, 0.0)  # fmt: skip
        on = frozenset(rng.sample([n.node_id for n in nodes], k=min(len(nodes), rng.randint(0, 2))))
        running.append(RunningOffload(
            job, rng.choice((10**9, 6 * 10**9)), rng.uniform(5, 400) * 3600.0, 3600.0,
            rng.uniform(1.0, 4.0), rng.choice((1.0, 1.2)), rng.uniform(0, 0.3), on,
        ))  # fmt: skip
    return running, nodes, label


@pytest.mark.parametrize("seed", range(400))
def test_per_class_tests_choose_as_every_node_tested(seed: int) -> None:
    rng = Random(seed)
    running, nodes, label = instance(rng)
    # an estimate that depends on the node only through its class, and on the job's
    # size and GPUs taken; ties are common (few distinct values)
    values = [1.0, 1.25, 1.5, 2.0, 3.0]
    table: dict[tuple[object, ...], tuple[float, float]] = {}

    def estimate(pbytes: int, gpus: int, node_id: str, take: int) -> tuple[float, float]:
        key = (label[node_id], pbytes, gpus, take)
        if key not in table:
            table[key] = (rng.choice(values), rng.choice((0.0, 0.0, 0.1, 0.4)))
        return table[key]

    def klass(n: NodeFree) -> Hashable:
        return label[n.node_id]

    speed = {"P100": 1.0, "V100": rng.choice((1.0, 1.6))}
    cfg = ReplaceConfig(min_gain=rng.choice((0.0, 0.1, 0.25)), payback=rng.choice((0.5, 4.0)))
    asked_ref: list[list[str]] = []
    asked_new: list[list[str]] = []

    def placer(log: list[list[str]]) -> Place:
        def place(job: JobRequest, ns: Sequence[NodeFree]) -> Allocation | None:
            log.append([n.node_id for n in ns])
            return first_fit(job, ns)

        return place

    # the table is filled in the reference's order, then read by both
    want = reference(running, nodes, speed, cfg, estimate, placer(asked_ref), klass)
    got = choose_move(running, nodes, speed, cfg, estimate, placer(asked_new), klass)
    assert got == want
    assert asked_new == asked_ref


def _by_kind(kind: dict[str, int], p: int, g: int, nid: str, take: int) -> tuple[float, float]:
    return 1.0 + kind[nid] * 0.5, 0.0


def _kind_of(kind: dict[str, int], n: NodeFree) -> Hashable:
    return kind[n.node_id]


def test_instances_reach_every_branch() -> None:
    """The random instances above move jobs in both ways (to the best class, and
    spread over nodes) and refuse others, so the comparison covers each."""
    seen: set[str] = set()
    for seed in range(400):
        rng = Random(seed)
        running, nodes, label = instance(rng)
        kind = {nid: lab[2] for nid, lab in label.items()}
        move = choose_move(running, nodes, {}, ReplaceConfig(min_gain=0.0, payback=0.1),
                           partial(_by_kind, kind), first_fit, partial(_kind_of, kind))  # fmt: skip
        if move is None:
            seen.add("none")
        else:
            seen.add("spread" if len(move.alloc.gpus) > 1 else "one node")
    assert seen == {"none", "spread", "one node"}
