"""Re-placement of running offloading jobs: checkpoint, stop, restart elsewhere.

Why: most migration time is held by a few offloading jobs that run for weeks on a
run-time estimate of about an hour (docs/results/offload-placement-results.md, "Where the
migration time comes from"), so no placer can tell them apart when they start. What
can be seen later is how long a job has run. A running offloading job becomes a candidate once it
has run `after` times its run-time estimate and at least `min_run_s`; if the
offload-aware placer (the MILP with the offload charge, or its greedy variant:
offload_term.py) finds room for it on the free GPUs of other nodes where its time
per unit of work is lower, it is moved there.

Decision (per candidate, longest-running first; one move per call, so every move
sees the state the previous one left):

    before = f_now / s_now                         time per unit of work now
    after  = f_new / s_new + Δ_new / s_new − ρ / s_now
    saved  = (before − after) · expect · elapsed / before
    move if f_new / s_new ≤ (1 − min_gain) · before  and  saved ≥ payback · cost

f the job's offload slowdown (its own: now, and on the place the placer chose,
with its GPUs added), s the GPU type's speed, Δ_new the slowdown it would add to
the offloading jobs already at the new place and ρ the slowdown its leaving takes
off those on its nodes now (both Σ over their GPUs, per GPU of the job: the
placer's Δ), elapsed its run time so far. `expect · elapsed` is the run time it
is expected still to need at its current rate: a job that has run e well past its
estimate is taken to run about `expect` · e more (a heavy-tailed guess, stated,
not learned). The move costs

    cost = restart_s + 2 · state_factor · param_bytes / (net_gbps · 10⁹)

seconds: a fixed restart overhead (process start, framework and data loader set-up)
plus its parameters and AdamW states (fp32: 3 × the parameter bytes) written to and
read back from shared storage at `net_gbps` GB/s. The simulator charges all of it
on the new GPUs (held, no progress) at the start of the new segment (`restart_s`
in --jobs-out); the old GPUs are freed at the decision (the checkpoint's write is
counted on the new GPUs, not the old ones: the same GPU-seconds, the job's finish
delayed by all of it).

Capacity: a move takes as many GPUs as it frees, and it is decided after the
round has placed the waiting jobs, on the GPUs they left; the job's current nodes
are not offered (a move within a node changes nothing the cost model reads).

The queue (`queue_check`, off by default): a move gives no GPU to the queue at
the moment it is made, and EASY's reservation cannot see it at all (the moved job
has overrun its estimate, so the reservation counts its GPUs as coming back now,
before and after). What it changes is when the moved job really ends, and who the
GPUs go to then: under FIFO, often a wave of large jobs that starts sooner while
the 1-GPU jobs that backfilled behind it wait longer
(docs/results/offload-replace-queue.md). The check plans the queue twice, without and
with the move: the first `queue_window` waiting jobs in arrival order (FIFO's
order; under another policy an approximation of it), each started in order at
the first time enough whole GPUs are free for its estimate (conservative
backfilling on GPU counts), against the running jobs' expected ends (start +
estimate; one past its estimate, now + expect × its run time so far, the same
guess as `saved`), the moved job ending at now + expect × elapsed without the
move and at now + cost + expect × elapsed − saved with it.
"pareto": the move is made only if no planned start is later with it; "total":
only if the planned starts' sum is not larger.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping, Sequence

from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree
from shared.sched.replacement import Move, QueuePlan, ReplaceConfig, RunningOffload, restart_cost_s

__all__ = ["choose_move", "planned_starts", "queue_allows"]

Estimate = Callable[[int, int, str, int], tuple[float, float]]


def planned_starts(
    now: float, free: int, ends: Sequence[tuple[float, int]], waiting: Sequence[tuple[int, float]]
) -> list[float]:
    """Conservative backfilling on GPU counts: each waiting job in order starts at the
    first time from which `gpus` whole GPUs stay free for its estimate, given the
    running jobs' `ends` ((time, GPUs)) and the jobs planned before it. inf: never
    (more GPUs than the cluster has)."""
    # the free-GPU profile: times and the free count from each time to the next
    times = [now]
    count = [free]
    for t, g in sorted(ends):
        t = max(t, now)
        if t == times[-1]:
            count[-1] += g
        else:
            times.append(t)
            count.append(count[-1] + g)
    out = []
    for gpus, est in waiting:
        est = max(est, 1.0)
        start = -1
        for i in range(len(times)):
            if count[i] < gpus:
                continue
            end = times[i] + est
            j = i
            while j + 1 < len(times) and times[j + 1] < end and count[j + 1] >= gpus:
                j += 1
            if j + 1 >= len(times) or times[j + 1] >= end:
                start = i
                break
        if start < 0:
            out.append(float("inf"))
            continue
        t0 = times[start]
        t1 = t0 + est
        k = bisect_left(times, t1)
        if k == len(times) or times[k] != t1:
            times.insert(k, t1)
            count.insert(k, count[k - 1])
        for m in range(start, k):
            count[m] -= gpus
        out.append(t0)
    return out


def queue_allows(
    plan: QueuePlan, job_id: str, gpus: int, end_before: float, end_after: float, mode: str
) -> bool:
    """Whether the queue check lets a move of `job_id` (its expected end from
    `end_before` to `end_after`) happen (module doc)."""
    if mode == "off" or not plan.waiting:
        return True
    ends = [(t, g) for jid, t, g in plan.running if jid != job_id]
    waiting = [(g, est) for _, g, est in plan.waiting]
    before = planned_starts(plan.now, plan.free, [*ends, (end_before, gpus)], waiting)
    after = planned_starts(plan.now, plan.free, [*ends, (end_after, gpus)], waiting)
    if mode == "pareto":
        return all(a <= b + 1e-6 for a, b in zip(after, before, strict=True))
    finite = [(a, b) for a, b in zip(after, before, strict=True) if b != float("inf")]
    return sum(a for a, _ in finite) <= sum(b for _, b in finite) + 1e-6


def choose_move(
    running: Sequence[RunningOffload],
    nodes: Sequence[NodeFree],
    speed: Mapping[str, float],
    cfg: ReplaceConfig,
    estimate: Estimate,
    place: Callable[[JobRequest, Sequence[NodeFree]], Allocation | None],
    klass: Callable[[NodeFree], Hashable],
    waiting: int = 0,
    queue: QueuePlan | None = None,
) -> Move | None:
    """The first candidate (longest elapsed first) worth moving, and where; or None.

    `estimate(param_bytes, gpus, node_id, take)` is OffloadView.estimate ((own
    slowdown, Δ)); `klass(node)` the node's class (nodes of one class are of one GPU
    type and give every job the same estimate: offload_term.py); `place(job, nodes)`
    the offload-aware placer's answer for the job alone on `nodes`, or None if it
    finds no room.

    A job some free node holds whole goes to the class of the node where the move
    saves most (ties: the first node), placed there by `place` (which GPUs); a job
    no free node holds whole is placed by `place` on all of them and tested there.
    Each class is tested once, on its first node that holds the job (the others
    would give the same figures). `waiting`: how many jobs wait (with `idle_only`,
    no move while any does); `queue`: what the queue check reads (a candidate it
    refuses is passed over)."""
    if cfg.idle_only and waiting:
        return None
    free_nodes: _FreeNodes | None = None  # built for the first candidate that needs it
    for r in sorted(running, key=lambda r: (-r.elapsed_s, r.job.job_id)):
        if r.elapsed_s < max(cfg.min_run_s, cfg.after * r.est_run_s):
            continue
        if r.moved_s is not None and r.moved_s < cfg.settle_s:
            continue
        if free_nodes is None:
            free_nodes = _FreeNodes(nodes, klass)
        fn = free_nodes
        before = r.slowdown / r.speed
        cost = restart_cost_s(r.param_bytes, cfg)
        g = r.job.num_gpus
        allowed = fn.allowed_types(r.job)
        own = [fn.pos[nid] for nid in r.nodes if nid in fn.pos]
        own = [i for i in own if fn.type[i] in allowed]
        if r.job.gpu_milli >= FULL_GPU and (
            sum(fn.whole_by_type[t] for t in allowed) - sum(fn.whole[i] for i in own) < g
        ):
            continue
        mine = set(own)
        milli = r.job.gpu_milli
        # the classes with a node that holds it (own nodes not excluded yet), by its own
        # time per unit of work there; a move passes only where that is at most
        # (1 − min_gain) · before, so the classes beyond are never tested
        ranked, holders = fn.ranked(estimate, speed, r.param_bytes, g, milli, allowed)
        held = len(holders) > len(holders & mine)
        limit = (1 - cfg.min_gain) * before
        best: list[int] | None = None  # the best class's nodes
        best_first, best_saved = 0, 0.0
        for rate, k in ranked:
            if rate > limit:
                break
            members = fn.classes[k]
            first = next((i for i in members if fn.holds(i, g, milli, allowed, mine)), None)
            if first is None:
                continue
            est = fn.estimate(estimate, r.param_bytes, g, k, first)
            got = _test(r, [(fn.ids[first], g)], [est], speed, before, cost, cfg, fn.type[first])
            if got is None:
                continue
            if best is None or got[1] > best_saved or (got[1] == best_saved and first < best_first):
                best, best_first, best_saved = members, first, got[1]
        if held:
            if best is None:
                continue  # nodes hold it whole, and no move there passes the test
            alloc = place(
                r.job, [fn.nodes[i] for i in best if fn.holds(i, g, milli, allowed, mine)]
            )
        else:
            free = [n for i, n in enumerate(fn.nodes) if i not in mine and fn.type[i] in allowed]
            if not free:
                continue
            # spread over nodes: its own rate is at least the best one GPU gets alone
            # on any free node (fewer GPUs there share less), Δ at least 0
            own_rate = min(estimate(r.param_bytes, g, n.node_id, 1)[0] / speed.get(n.gpu_type, 1.0)
                           for n in free)  # fmt: skip
            saved = (before - own_rate + r.relief / r.speed) * cfg.expect * r.elapsed_s / before
            if own_rate > limit or saved < cfg.payback * cost:
                continue
            alloc = place(r.job, free)
        if alloc is None:
            continue
        parts = [(nid, len(idx)) for nid, idx in alloc.gpus]
        slowest = min((fn.type[fn.pos[nid]] for nid, _ in parts), key=lambda t: speed.get(t, 1.0))
        ests = [estimate(r.param_bytes, g, nid, take) for nid, take in parts]
        got = _test(r, parts, ests, speed, before, cost, cfg, slowest)
        if got is None:
            continue
        if queue is not None and cfg.queue_check != "off":
            remaining = cfg.expect * r.elapsed_s  # at today's rate (`saved`'s guess)
            end_before = queue.now + remaining
            end_after = queue.now + cost + remaining - got[1]
            g = r.job.num_gpus if r.job.gpu_milli >= FULL_GPU else 0
            if not queue_allows(queue, r.job.job_id, g, end_before, end_after, cfg.queue_check):
                continue
        return Move(r.job.job_id, alloc, cost, before, got[0], got[1])
    return None


class _FreeNodes:
    """What `choose_move` reads of the free nodes, computed once per call: per node its
    whole free GPUs and the most free on one GPU, the whole free GPUs per type, and
    the nodes grouped by class (node order kept within and across classes, by first
    member); per job size, its estimate on each class and the classes ranked by it."""

    def __init__(self, nodes: Sequence[NodeFree], klass: Callable[[NodeFree], Hashable]) -> None:
        self.nodes = nodes
        self.ids = [n.node_id for n in nodes]
        self.type = [n.gpu_type for n in nodes]
        self.pos = {nid: i for i, nid in enumerate(self.ids)}
        self.whole = [sum(1 for f in n.free_milli if f >= FULL_GPU) for n in nodes]
        self.most = [max(n.free_milli, default=0) for n in nodes]
        self.whole_by_type: dict[str, int] = {}
        for t, w in zip(self.type, self.whole, strict=True):
            self.whole_by_type[t] = self.whole_by_type.get(t, 0) + w
        groups: dict[Hashable, list[int]] = {}
        for i, n in enumerate(nodes):
            groups.setdefault(klass(n), []).append(i)
        self.klass_of = [0] * len(nodes)  # node -> its class's index in `classes`
        for k, m in enumerate(groups.values()):
            for i in m:
                self.klass_of[i] = k
        self.classes = list(groups.values())  # each class's nodes, in node order
        self._allowed: dict[frozenset[str], frozenset[str]] = {}
        self._est: dict[tuple[int, int, int], tuple[float, float]] = {}
        self._ranked: dict[
            tuple[int, int, int, frozenset[str]], tuple[list[tuple[float, int]], frozenset[int]]
        ] = {}

    def estimate(
        self, estimate: Estimate, param_bytes: int, gpus: int, k: int, i: int
    ) -> tuple[float, float]:
        """A job's estimate on class `k` taking `gpus` GPUs of one node (node `i`, a
        member): asked once per call for each job size and class."""
        key = (param_bytes, gpus, k)
        got = self._est.get(key)
        if got is None:
            got = self._est[key] = estimate(param_bytes, gpus, self.ids[i], gpus)
        return got

    def ranked(
        self,
        estimate: Estimate,
        speed: Mapping[str, float],
        param_bytes: int,
        gpus: int,
        milli: int,
        allowed: frozenset[str],
    ) -> tuple[list[tuple[float, int]], frozenset[int]]:
        """For a job of this size: (own time per unit of work, class) for every class
        with a node that holds it (own nodes not excluded), fastest first; and the
        nodes that hold it. Computed once per call for each size."""
        key = (param_bytes, gpus, milli, allowed)
        got = self._ranked.get(key)
        if got is None:
            none: set[int] = set()
            holders = [
                i for i in range(len(self.nodes)) if self.holds(i, gpus, milli, allowed, none)
            ]
            first: dict[int, int] = {}  # class -> its first node that holds the job
            for i in holders:
                first.setdefault(self.klass_of[i], i)
            ranked = []
            for k, i in first.items():
                f = self.estimate(estimate, param_bytes, gpus, k, i)[0]
                ranked.append((f / speed.get(self.type[i], 1.0), k))
            ranked.sort()
            got = self._ranked[key] = (ranked, frozenset(holders))
        return got

    def holds(self, i: int, gpus: int, milli: int, allowed: frozenset[str], mine: set[int]) -> bool:
        """Whether node `i` alone takes the job: an allowed type, not one of its own
        nodes, `gpus` whole free GPUs (one GPU: `milli` free on one)."""
        if i in mine or self.type[i] not in allowed:
            return False
        return self.whole[i] >= gpus or (gpus == 1 and self.most[i] >= milli)

    def allowed_types(self, job: JobRequest) -> frozenset[str]:
        got = self._allowed.get(job.gpu_types)
        if got is None:
            got = self._allowed[job.gpu_types] = frozenset(
                t for t in self.whole_by_type if job.allows(t)
            )
        return got


def _test(
    r: RunningOffload,
    parts: Sequence[tuple[str, int]],
    ests: Sequence[tuple[float, float]],
    speed: Mapping[str, float],
    before: float,
    cost: float,
    cfg: ReplaceConfig,
    slowest: str,
) -> tuple[float, float] | None:
    """(after, saved) of moving `r` to `parts` ((node id, GPUs)) if the move passes the
    test of the module doc, else None. It runs at its slowest node (synchronous data
    parallel); Δ is summed over its parts by their GPUs. `ests`: the estimate for
    each part ((own slowdown, Δ))."""
    s = speed.get(slowest, 1.0)
    g = r.job.num_gpus
    own = caused = 0.0
    for (_, take), (f, d) in zip(parts, ests, strict=True):
        own = max(own, f / s)
        caused += d * take / g / s
    after = own + caused - r.relief / r.speed
    saved = (before - after) * cfg.expect * r.elapsed_s / before
    if own <= (1 - cfg.min_gain) * before and saved >= cfg.payback * cost:
        return after, saved
    return None
