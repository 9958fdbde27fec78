"""Job-side variables of the MILP, aggregated so identical jobs do not multiply it.

Jobs with the same demand (whole GPUs k, or share m), the same fitting types and
the same allowed types (so the same type penalty) form a job class. Its members
differ only in value, so:

    x_{j,s} ∈ {0,1}   job j starts on some type of speed group s (types of equal speed)
    n_{c,t} ∈ Z+      members of job class c that start on type t
    Σ_s x_{j,s} ≤ 1                      once
    Σ_{j∈c} x_{j,s} = Σ_{t∈s} n_{c,t}     the class's starts, split by type
    Σ_s x_{j,s} ≥ Σ_s x_{j',s}            j before j' in c by value (symmetry breaking:
                                          swapping two members never loses value)

This is y_{j,t} of milp.py with y_{j,t} ↦ (x_{j,speed(t)}, n_{c(j),t}): exact,
because V_{j,t} depends on t only through speed_t.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from services.placement.objective import Scorer
from shared.placement_api import FULL_GPU, JobRequest

__all__ = ["JobClass", "JobVars", "MultiVars"]


@dataclass(frozen=True, slots=True)
class JobClass:
    share: bool  # a single-GPU sharing job class
    size: int  # slot key: whole GPUs per job (+ STREAM if it streams), or milli of the share
    types: tuple[str, ...]  # GPU types its jobs may use and could fit on
    members: tuple[int, ...]  # window positions, most valuable first


class JobVars:
    def __init__(
        self,
        m: cp_model.CpModel,
        jobs: Sequence[JobRequest],
        types_of: Mapping[int, Sequence[str]],
        scorer: Scorer,
    ) -> None:
        self.jobs = jobs
        speed = scorer.speed
        # speed group of each type: types of equal speed are interchangeable for value
        self.group = {t: speed.get(t, 1.0) for ts in types_of.values() for t in ts}
        self.classes = self._classes(jobs, types_of, scorer)
        # x[j, s] = 1 iff job j starts on a type of speed group s
        self.x: dict[tuple[int, float], cp_model.IntVar] = {}
        # n[c, t] = members of job class c that start on type t
        self.n: dict[tuple[int, str], cp_model.IntVar] = {}
        self.value: dict[tuple[int, float], int] = {}  # objective coefficient of x[j, s]
        for ci, c in enumerate(self.classes):
            groups = sorted({self.group[t] for t in c.types})
            for j in c.members:
                for s in groups:
                    self.x[j, s] = m.new_bool_var(f"x{j}_{s}")
                    t = next(t for t in c.types if self.group[t] == s)
                    self.value[j, s] = scorer.value(j, t)
                if len(groups) > 1:
                    m.add_at_most_one(self.x[j, s] for s in groups)
            for t in c.types:
                self.n[ci, t] = m.new_int_var(0, len(c.members), f"n{ci}_{t}")
            for s in groups:
                starts = [self.x[j, s] for j in c.members]
                split = [self.n[ci, t] for t in c.types if self.group[t] == s]
                m.add(sum(starts) == sum(split))
            for a, b in zip(c.members, c.members[1:], strict=False):
                m.add(sum(self.x[a, s] for s in groups) >= sum(self.x[b, s] for s in groups))

    @staticmethod
    def _classes(
        jobs: Sequence[JobRequest], types_of: Mapping[int, Sequence[str]], scorer: Scorer
    ) -> list[JobClass]:
        # The allowed types are part of the key, not only the fitting ones: the type
        # penalty T_j,t is measured from the least pressed *allowed* type, and the model
        # charges it per class (n_{c,t}), so every member must have the same T_j,t.
        # (Jobs allowed {A, B} and {B}, both fitting only B, once shared a class and the
        # first member's penalty: CP-SAT proved OPTIMAL a placement 2 below the best.)
        # Likewise a per-job charge on each type (offload_term.py) is part of the key.
        Key = tuple[bool, int, tuple[str, ...], tuple[str, ...], tuple[int, ...]]
        members: dict[Key, list[int]] = defaultdict(list)
        charge = scorer.charge
        for j, ts in types_of.items():
            share = jobs[j].gpu_milli < FULL_GPU
            size = scorer.slot_key(jobs[j])  # a streaming job's slots are their own kind
            allowed = tuple(sorted(jobs[j].gpu_types))
            costs = tuple(charge(jobs[j], t) for t in ts) if charge is not None else ()
            members[(share, size, tuple(ts), allowed, costs)].append(j)
        out = []
        for (share, size, ts, _, _), js in sorted(members.items()):
            js.sort(key=lambda j: (-scorer.value(j, ts[0]), j))
            out.append(JobClass(share, size, ts, tuple(js)))
        return out

    def users(self, t: str, share: bool, size: int) -> list[cp_model.IntVar]:
        """n variables of the job classes that fill slots of this kind on type t."""
        return [
            self.n[ci, t]
            for ci, c in enumerate(self.classes)
            if c.share == share and c.size == size and t in c.types
        ]

    def hint(self, placed: Mapping[int, str]) -> dict[int, int]:
        """Hint values (variable index -> value) from a placement: window position ->
        GPU type it starts on."""
        out: dict[int, int] = {}
        counts: dict[tuple[int, str], int] = defaultdict(int)
        starts: dict[int, int] = defaultdict(int)  # class -> members started
        for ci, c in enumerate(self.classes):
            for j in c.members:
                if j in placed and placed[j] in c.types:
                    counts[ci, placed[j]] += 1
                    starts[ci] += 1
        # respect the symmetry breaking: the class's starts are its first members
        for ci, c in enumerate(self.classes):
            by_group: list[float] = []
            for t in c.types:
                by_group += [self.group[t]] * counts[ci, t]
            for i, j in enumerate(c.members):
                for s in {self.group[t] for t in c.types}:
                    out[self.x[j, s].index] = int(i < len(by_group) and by_group[i] == s)
            for t in c.types:
                out[self.n[ci, t].index] = counts[ci, t]
        return out

    def decode(
        self, value: Callable[[cp_model.IntVar], int]
    ) -> dict[tuple[str, bool, int], list[int]]:
        """(type, share, size) -> window positions of the jobs that start there."""
        out: dict[tuple[str, bool, int], list[int]] = defaultdict(list)
        for ci, c in enumerate(self.classes):
            for s in sorted({self.group[t] for t in c.types}):
                started = [j for j in c.members if value(self.x[j, s])]
                for t in c.types:
                    if self.group[t] != s:
                        continue
                    k = value(self.n[ci, t])
                    out[(t, c.share, c.size)].extend(started[:k])
                    started = started[k:]
        return out


class MultiVars:
    """Multi-node jobs (bigger than any allowed node's whole free GPUs), in the model:

    y_{j,t} ∈ {0,1}   job j starts on nodes of type t
    r_{j,t,s} ∈ Z+    parts of s GPUs it takes (each part is a whole slot on one node)
    Σ_t y_{j,t} ≤ 1,   Σ_s s·r_{j,t,s} = k_j·y_{j,t}
    objective: (V_{j,t} − T_{j,t} + spread_weight)·y_{j,t} − spread_weight·Σ_s r_{j,t,s}
    (each part beyond the first costs spread_weight: fewest nodes).
    """

    def __init__(
        self,
        m: cp_model.CpModel,
        jobs: Sequence[JobRequest],
        types_of: Mapping[int, Sequence[str]],
        part_sizes: Mapping[str, Sequence[int]],
        scorer: Scorer,
    ) -> None:
        spread = round(scorer.weights.spread_weight)
        self.y: dict[tuple[int, str], cp_model.IntVar] = {}
        # (j, t) -> [(s, r_{j,t,s})]
        self.parts: dict[tuple[int, str], list[tuple[int, cp_model.IntVar]]] = {}
        self.coef: dict[int, int] = {}  # variable index -> objective coefficient
        for j, ts in types_of.items():
            k = jobs[j].num_gpus
            for t in ts:
                y = self.y[j, t] = m.new_bool_var(f"my{j}_{t}")
                parts = [(s, m.new_int_var(0, k // s, f"mr{j}_{t}_{s}")) for s in part_sizes[t]]
                self.parts[j, t] = parts
                m.add(
                    cp_model.LinearExpr.weighted_sum([r for _, r in parts], [s for s, _ in parts])
                    == k * y
                )
                self.coef[y.index] = scorer.value(j, t) - scorer.type_pen(j, t) + spread
                for _, r in parts:
                    self.coef[r.index] = -spread
            if len(ts) > 1:
                m.add_at_most_one(self.y[j, t] for t in ts)

    def users(self, t: str, size: int) -> list[cp_model.IntVar]:
        """Part variables taking whole slots of `size` GPUs on type t."""
        return [
            r for (_, tt), parts in self.parts.items() if tt == t for s, r in parts if s == size
        ]

    def zero_hint(self) -> dict[int, int]:
        return dict.fromkeys(self.coef, 0)

    def decode(self, value: Callable[[cp_model.IntVar], int]) -> dict[tuple[str, int], list[int]]:
        """(type, slot size) -> a window position per part that takes such a slot."""
        out: dict[tuple[str, int], list[int]] = defaultdict(list)
        for (j, t), parts in self.parts.items():
            for s, r in parts:
                out[(t, s)].extend([j] * value(r))
        return out
