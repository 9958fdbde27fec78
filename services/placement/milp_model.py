"""The CP-SAT model of one window over shape classes (formulation: milp.py).

Data, variables, constraints, objective, solve, in that order; then the hint
(from a greedy placement) and the decoding of class counts into concrete
node / GPU indices.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from services.placement.classes import STREAM, ClassIndex, GpuRef, PatternCache, slot_gpus
from services.placement.milp_jobs import JobVars, MultiVars
from services.placement.objective import Scorer
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree

__all__ = ["SolveOutcome", "WindowModel"]

_STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "TIMEOUT_FEASIBLE"}


@dataclass(frozen=True, slots=True)
class SolveOutcome:
    status: str  # OPTIMAL, TIMEOUT_FEASIBLE, or the CP-SAT status name when no solution
    allocations: tuple[Allocation, ...]
    bound: float  # CP-SAT's best objective bound
    truncated: bool  # a pattern list was cut at max_patterns (optimum may be missed)
    variables: int


@dataclass(slots=True)
class _ClassVars:
    """Pattern-count variables of one class: count[p] members take pattern pats[p]."""

    gpu_type: str
    capacity: int  # W (node class) or f (GPU class)
    sizes: tuple[int, ...]  # slot sizes the counts refer to (GPUs, or milli)
    pats: list[tuple[int, ...]]
    count: list[cp_model.IntVar]
    coef: list[int]  # objective coefficient of each pattern: − fragmentation it adds


class _Model(cp_model.CpModel):
    """A CpModel without the CamelCase aliases OR-Tools attaches to every new model
    (a dir() walk costing ~2 ms each: a third of a small window's solve)."""

    def _add_pre_pep8_methods(self) -> None:
        pass


class WindowModel:
    """One window's model. `cand` are window positions of single-node candidate jobs,
    `multi` those of multi-node ones."""

    def __init__(
        self,
        jobs: Sequence[JobRequest],
        cand: Sequence[int],
        nodes: Sequence[NodeFree],
        classes: ClassIndex,
        scorer: Scorer,
        max_patterns: int,
        multi: Sequence[int] = (),
    ) -> None:
        self.jobs, self.nodes, self.classes, self.scorer = jobs, nodes, classes, scorer
        self.m = _Model()
        self.truncated = False
        self._patterns = PatternCache(max_patterns)
        # ---- data: which types each candidate may use, and slot sizes per type
        self.types_of = self._fitting_types(cand)
        self.whole_sizes: dict[str, Counter[int]] = defaultdict(Counter)  # t -> k -> jobs
        self.share_sizes: dict[str, Counter[int]] = defaultdict(Counter)  # t -> milli -> jobs
        for j, ts in self.types_of.items():
            sizes = self.share_sizes if jobs[j].gpu_milli < FULL_GPU else self.whole_sizes
            size = scorer.slot_key(jobs[j])  # its share, its GPUs, or a streaming slot
            for t in ts:
                sizes[t][size] += 1
        multi_types, part_sizes = self._multi_parts(multi)
        # ---- variables
        # which jobs start, on which type (x, n of milp_jobs.py)
        self.jv = JobVars(self.m, jobs, self.types_of, scorer)
        # which multi-node jobs start, on which type, in which parts (milp_jobs.py)
        self.mv = MultiVars(self.m, jobs, multi_types, part_sizes, scorer)
        # opened[t] = whole free GPUs of type t handed to sharing jobs
        self.opened: dict[str, cp_model.IntVar] = {}
        self._opened_ub: dict[str, int] = {}  # upper bound of opened[t]
        self.node_vars = self._node_classes()
        self.gpu_vars, self.fresh_vars = self._gpu_classes()
        # ---- constraints and objective
        self._constraints()
        self._objective()

    def _multi_parts(
        self, multi: Sequence[int]
    ) -> tuple[dict[int, list[str]], dict[str, list[int]]]:
        """Types each multi-node job could fill, and the part sizes per type: every
        whole-free count of a node of the type, and 1, 2, 4 so any size adds up."""
        free: dict[str, int] = defaultdict(int)  # t -> whole free GPUs over its nodes
        sizes: dict[str, set[int]] = defaultdict(set)
        for (t, w), members in self.classes.node_classes.items():
            free[t] += w * len(members)
            sizes[t] |= {w} | {s for s in (1, 2, 4) if s <= w}
        types_of: dict[int, list[str]] = {}
        for j in multi:
            job = self.jobs[j]
            ts = [t for t in sorted(free) if job.allows(t) and free[t] >= job.num_gpus]
            if ts:
                types_of[j] = ts
            for t in ts:
                for s in sizes[t]:
                    self.whole_sizes[t][s] += job.num_gpus // s
        return types_of, {t: sorted(v) for t, v in sizes.items()}

    def _fitting_types(self, cand: Sequence[int]) -> dict[int, list[str]]:
        max_w: dict[str, int] = defaultdict(int)  # t -> largest whole free GPUs on a node
        max_f: dict[str, int] = defaultdict(int)  # t -> largest free share on one GPU
        for t, w in self.classes.node_classes:
            max_w[t] = max(max_w[t], w)
            max_f[t] = FULL_GPU
        for t, f in self.classes.gpu_classes:
            max_f[t] = max(max_f[t], f)
        out: dict[int, list[str]] = {}
        for j in cand:
            job = self.jobs[j]
            share = job.gpu_milli < FULL_GPU
            ts = [
                t
                for t in sorted(set(max_w) | set(max_f))
                if job.allows(t)
                and (max_f[t] >= job.gpu_milli if share else max_w[t] >= job.num_gpus)
            ]
            if ts:
                out[j] = ts
        return out

    def _new_class(
        self, t: str, cap: int, sizes: Counter[int], ub: int, node: bool
    ) -> _ClassVars | None:
        """Patterns and their count variables for one class (node or GPU level)."""
        keys = tuple(sorted(sizes))
        top = (
            max((w for tt, w in self.classes.node_classes if tt == t), default=0)
            if node
            else FULL_GPU
        )
        pats, used, cut = self._patterns.get(cap, max(top, cap), keys, [sizes[k] for k in keys])
        self.truncated |= cut
        if not pats:
            return None
        count = [self.m.new_int_var(0, ub, f"n{t}_{cap}_{i}") for i in range(len(pats))]
        pen = self.scorer.node_pen if node else self.scorer.gpu_pen
        # fragmentation the pattern adds: penalty of what it leaves − penalty of before
        coef = [pen(t, cap) - pen(t, cap - u) for u in used]
        if node and any(k > STREAM for k in keys):  # and what its streaming slots cost
            charged = zip(coef, pats, strict=True)
            coef = [c - self.scorer.pattern_charge(t, keys, p) for c, p in charged]
        return _ClassVars(t, cap, keys, pats, count, coef)

    def _node_classes(self) -> dict[tuple[str, int], _ClassVars]:
        out: dict[tuple[str, int], _ClassVars] = {}
        for (t, w), members in self.classes.node_classes.items():
            sizes = Counter(self.whole_sizes[t])
            if self.share_sizes[t]:  # a size-1 slot may be opened for sharing
                sizes[1] += self.share_sizes[t].total()
                if t not in self.opened:
                    self.opened[t] = self.m.new_int_var(0, self.share_sizes[t].total(), f"o{t}")
                    self._opened_ub[t] = self.share_sizes[t].total()
            cv = self._new_class(t, w, sizes, len(members), True) if sizes else None
            if cv is not None:
                out[(t, w)] = cv
        return out

    def _gpu_classes(self) -> tuple[dict[tuple[str, int], _ClassVars], dict[str, _ClassVars]]:
        partial: dict[tuple[str, int], _ClassVars] = {}
        for (t, f), members in self.classes.gpu_classes.items():
            if self.share_sizes[t]:
                cv = self._new_class(t, f, self.share_sizes[t], len(members), False)
                if cv is not None:
                    partial[(t, f)] = cv
        fresh: dict[str, _ClassVars] = {}
        for t in self.opened:
            cv = self._new_class(t, FULL_GPU, self.share_sizes[t], self._opened_ub[t], False)
            if cv is not None:
                fresh[t] = cv
        return partial, fresh

    def _constraints(self) -> None:
        m = self.m
        for (_, w), cv in self.node_vars.items():  # patterns per class <= its members
            m.add(sum(cv.count) <= len(self.classes.node_classes[(cv.gpu_type, w)]))
        for key, cv in self.gpu_vars.items():
            m.add(sum(cv.count) <= len(self.classes.gpu_classes[key]))
        for t, o in self.opened.items():  # every opened GPU takes one share pattern
            fresh = self.fresh_vars.get(t)
            m.add(o == (sum(fresh.count) if fresh else 0))
        # slots of each size offered by the patterns == jobs (and opened GPUs) using them
        offered = self._offered()
        for (t, share, k), (vars_, coefs) in offered.items():
            users = self.jv.users(t, share, k) + ([] if share else self.mv.users(t, k))
            if not share and k == 1 and t in self.opened:
                users.append(self.opened[t])
            m.add(sum(users) == cp_model.LinearExpr.weighted_sum(vars_, coefs))
        for t in self.opened:  # opened GPUs need size-1 slots even if no 1-GPU job exists
            if (t, False, 1) not in offered:
                m.add(self.opened[t] == 0)
        for ci, c in enumerate(self.jv.classes):  # a job kind no pattern offers cannot start
            for t in c.types:
                if (t, c.share, c.size) not in offered:
                    m.add(self.jv.n[ci, t] == 0)
        for (_, t), parts in self.mv.parts.items():
            for s, r in parts:
                if (t, False, s) not in offered:
                    m.add(r == 0)

    def _offered(self) -> dict[tuple[str, bool, int], tuple[list[cp_model.IntVar], list[int]]]:
        """(type, share, size) -> pattern-count variables and the slots each offers."""
        out: dict[tuple[str, bool, int], tuple[list[cp_model.IntVar], list[int]]] = {}
        groups: list[tuple[bool, list[_ClassVars]]] = [(False, list(self.node_vars.values()))]
        groups.append((True, [*self.gpu_vars.values(), *self.fresh_vars.values()]))
        for share, classes in groups:
            for cv in classes:
                for p, var in zip(cv.pats, cv.count, strict=True):
                    for c, k in zip(p, cv.sizes, strict=True):
                        if c:
                            vars_, coefs = out.setdefault((cv.gpu_type, share, k), ([], []))
                            vars_.append(var)
                            coefs.append(c)
        return out

    def _objective(self) -> None:
        terms: dict[int, int] = {}  # variable index -> objective coefficient (maximised)
        for key, var in self.jv.x.items():  # throughput
            terms[var.index] = self.jv.value[key]
        for (ci, t), var in self.jv.n.items():  # capacity restricted jobs will need
            terms[var.index] = -self.scorer.type_pen(self.jv.classes[ci].members[0], t)
        terms.update(self.mv.coef)  # multi-node jobs: throughput, pressure, spread
        for cv in [*self.node_vars.values(), *self.gpu_vars.values(), *self.fresh_vars.values()]:
            for var, c in zip(cv.count, cv.coef, strict=True):
                terms[var.index] = c  # fragmentation added by each pattern
        # maximize, written into the proto in bulk (the Python wrapper appends one by one)
        obj = self.m.proto.objective
        obj.vars.extend(list(terms))
        obj.coeffs.extend([-c for c in terms.values()])
        obj.scaling_factor = -1.0

    # ---- warm start: a feasible placement (the greedy one) as a complete hint -------

    def hint(self, allocs: Sequence[Allocation]) -> None:
        """Hint every variable from `allocs` (single-node allocations of candidates)."""
        pos = {n.node_id: i for i, n in enumerate(self.nodes)}
        jpos = {self.jobs[j].job_id: j for j in self.types_of}
        placed: dict[int, str] = {}  # window position -> type it starts on
        node_use: dict[int, Counter[int]] = defaultdict(Counter)  # node -> slot size -> count
        gpu_use: dict[GpuRef, Counter[int]] = defaultdict(Counter)  # GPU -> share -> count
        for a in allocs:
            j = jpos.get(a.job_id)
            if j is None or len(a.gpus) != 1:
                continue
            node_id, idx = a.gpus[0]
            n = pos[node_id]
            t = self.nodes[n].gpu_type
            if t not in self.types_of[j]:
                continue
            placed[j] = t
            if a.gpu_milli >= FULL_GPU:
                node_use[n][self.scorer.slot_key(self.jobs[j])] += 1
                continue
            if self.nodes[n].free_milli[idx[0]] >= FULL_GPU and not gpu_use[(n, idx[0])]:
                node_use[n][1] += 1  # a whole free GPU opened to sharing
            gpu_use[(n, idx[0])][a.gpu_milli] += 1
        counts: dict[int, int] = {}  # variable index -> hinted count
        opened: Counter[str] = Counter()
        for n, use in node_use.items():
            t = self.nodes[n].gpu_type
            self._count(self.node_vars.get((t, len(self.classes.whole_idx[n]))), use, counts)
        for (n, g), use in gpu_use.items():
            t, f = self.nodes[n].gpu_type, self.nodes[n].free_milli[g]
            if f >= FULL_GPU:
                opened[t] += 1
            cv = self.fresh_vars.get(t) if f >= FULL_GPU else self.gpu_vars.get((t, f))
            self._count(cv, use, counts)
        self.hint_values(placed, counts, opened)

    def hint_values(
        self, placed: dict[int, str], counts: dict[int, int], opened: Counter[str]
    ) -> None:
        """Hint all variables: job -> type started on, pattern variable index -> count,
        type -> GPUs opened to sharing."""
        values = self.jv.hint(placed)
        values.update(self.mv.zero_hint())  # multi-node jobs: spread after, if not started
        for t, var in self.opened.items():
            values[var.index] = opened[t]
        for cv in [*self.node_vars.values(), *self.gpu_vars.values(), *self.fresh_vars.values()]:
            for var in cv.count:
                values[var.index] = counts.get(var.index, 0)
        hint = self.m.proto.solution_hint  # in bulk, as for the objective
        hint.vars.extend(list(values))
        hint.values.extend(list(values.values()))

    @staticmethod
    def _count(cv: _ClassVars | None, use: Counter[int], counts: dict[int, int]) -> None:
        if cv is None:
            return
        p = tuple(use[k] for k in cv.sizes)
        if p in cv.pats and sum(use.values()) == sum(p):
            var = cv.count[cv.pats.index(p)]
            counts[var.index] = counts.get(var.index, 0) + 1

    def solve(
        self, time_limit_s: float, workers: int, deterministic_time: float | None = None
    ) -> SolveOutcome:
        """Solve within the wall-clock limit, or (reproducibly) within `deterministic_time`
        of CP-SAT's deterministic time; with no time left at all, the hint is the answer."""
        solver = cp_model.CpSolver()
        if deterministic_time is not None:
            solver.parameters.max_deterministic_time = deterministic_time
            workers = 1  # one worker: the search itself is deterministic
        elif time_limit_s <= 0:
            return self._from_hint(cp_model.UNKNOWN)
        else:
            solver.parameters.max_time_in_seconds = max(time_limit_s, 0.001)
        solver.parameters.num_workers = workers
        solver.parameters.cp_model_probing_level = 0  # probing alone costs ~90 ms here
        solver.parameters.max_presolve_iterations = 1
        solver.parameters.symmetry_level = 0  # job classes already remove the symmetry
        solver.parameters.linearization_level = 2  # the pattern LP is tight: use it fully
        code = solver.solve(self.m)
        nvars = len(self.m.proto.variables)
        if code not in _STATUS:  # e.g. the limit hit during presolve: the hint is feasible
            return self._from_hint(code)
        allocs = self._decode(solver.value)
        return SolveOutcome(
            _STATUS[code], tuple(allocs), solver.best_objective_bound, self.truncated, nvars
        )

    def _from_hint(self, code: object) -> SolveOutcome:
        nvars = len(self.m.proto.variables)
        hint = self.m.proto.solution_hint
        if not hint.vars:
            name = getattr(code, "name", str(code))
            return SolveOutcome(name, (), 0.0, self.truncated, nvars)
        values = dict(zip(hint.vars, hint.values, strict=True))
        allocs = self._decode(lambda v: values.get(v.index, 0))
        return SolveOutcome("TIMEOUT_HINT", tuple(allocs), 0.0, self.truncated, nvars)

    # ---- decoding: class counts -> concrete GPU indices -------------------------------

    def _decode(self, value: Callable[[cp_model.IntVar], int]) -> list[Allocation]:
        """Allocations from variable values (a solver's solution, or the hint)."""
        nodes, out = self.nodes, []
        starts = self.jv.decode(value)  # (type, share, size) -> jobs starting there
        parts = self.mv.decode(value)  # (type, size) -> a multi-node job per part
        spread: dict[int, dict[int, list[int]]] = defaultdict(dict)  # job -> node -> GPUs
        fresh: dict[str, list[GpuRef]] = defaultdict(list)  # GPUs opened to sharing, per type
        for (t, k), slots in self._whole_slots(value).items():
            jobs = starts[(t, False, k)]
            for j, (n, idx) in zip(jobs, slots, strict=False):
                out.append(Allocation(self.jobs[j].job_id, ((nodes[n].node_id, idx),)))
            claim = parts.get((t, k), [])
            for j, (n, idx) in zip(claim, slots[len(jobs) :], strict=False):
                spread[j].setdefault(n, []).extend(idx)
            fresh[t].extend((n, idx[0]) for n, idx in slots[len(jobs) + len(claim) :])
        for j, on in spread.items():
            gpus = tuple((nodes[n].node_id, tuple(sorted(g))) for n, g in on.items())
            out.append(Allocation(self.jobs[j].job_id, gpus))
        for (t, k), refs in self._share_slots(value, fresh).items():
            jobs = starts[(t, True, k)]
            for j, (n, g) in zip(jobs, refs, strict=True):
                out.append(Allocation(self.jobs[j].job_id, ((nodes[n].node_id, (g,)),), k))
        return out

    def _whole_slots(
        self, value: Callable[[cp_model.IntVar], int]
    ) -> dict[tuple[str, int], list[tuple[int, tuple[int, ...]]]]:
        """(type, k) -> (node, GPU indices) of each k-GPU slot the node patterns offer."""
        slots: dict[tuple[str, int], list[tuple[int, tuple[int, ...]]]] = defaultdict(list)
        for (t, w), cv in self.node_vars.items():
            node_iter = iter(self.classes.node_classes[(t, w)])
            for p, var in zip(cv.pats, cv.count, strict=True):
                for _ in range(value(var)):
                    n = next(node_iter)
                    idx, at = self.classes.whole_idx[n], 0
                    keys = sorted(zip(p, cv.sizes, strict=True), key=lambda x: -slot_gpus(x[1]))
                    for c, k in keys:
                        for _ in range(c):
                            slots[(t, k)].append((n, idx[at : at + slot_gpus(k)]))
                            at += slot_gpus(k)
        return slots

    def _share_slots(
        self, value: Callable[[cp_model.IntVar], int], fresh: dict[str, list[GpuRef]]
    ) -> dict[tuple[str, int], list[GpuRef]]:
        """(type, milli) -> the GPU of each share slot the GPU patterns offer."""
        slots: dict[tuple[str, int], list[GpuRef]] = defaultdict(list)
        members_of = [(cv, iter(self.classes.gpu_classes[k])) for k, cv in self.gpu_vars.items()]
        members_of += [(cv, iter(fresh[t])) for t, cv in self.fresh_vars.items()]
        for cv, gpu_iter in members_of:
            for p, var in zip(cv.pats, cv.count, strict=True):
                for _ in range(value(var)):
                    ref = next(gpu_iter)
                    for c, k in zip(p, cv.sizes, strict=True):
                        slots[(cv.gpu_type, k)].extend([ref] * c)
        return slots
