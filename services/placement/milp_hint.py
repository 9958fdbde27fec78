"""A complete warm-start hint for the window model, built on its own classes.

A greedy in priority order, like greedy.py, but over class members and
patterns (so it costs microseconds per job where greedy.py scans every node)
and scored by the model's objective: each job goes where it adds the most to
the objective (its value minus the fragmentation its slot adds), either
extending a member already in use (its pattern stays one of the model's) or
taking a fresh member. A share may open a whole GPU (a size-1 node slot).
The result is a feasible assignment of every model variable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable

from services.placement.milp_model import WindowModel, _ClassVars
from shared.placement_api import FULL_GPU

__all__ = ["class_greedy_hint"]

Pattern = tuple[int, ...]
# (gain, class key, pattern before or None for a fresh member, pattern after)
Option = tuple[int, Hashable, Pattern | None, Pattern]


class _Level:
    """Members in use at one level (nodes or GPUs), counted by (class, pattern)."""

    def __init__(
        self,
        classes: dict[Hashable, _ClassVars],
        avail: dict[Hashable, int],
        type_of: Callable[[Hashable], str],
    ) -> None:
        self.classes = classes
        self.avail = avail  # class key -> members that may still be taken
        # objective coefficient of each pattern of each class
        self.gain = {k: dict(zip(cv.pats, cv.coef, strict=True)) for k, cv in classes.items()}
        self.keys: dict[str, list[Hashable]] = {}  # GPU type -> its class keys
        for k in classes:
            self.keys.setdefault(type_of(k), []).append(k)
        # GPU type -> (class, pattern) -> members in use with that pattern
        self.touched: dict[str, Counter[tuple[Hashable, Pattern]]] = {
            t: Counter() for t in self.keys
        }
        self._type_of = type_of

    def best(self, t: str, size: int) -> Option | None:
        """The option that puts one slot of `size` on a class of type t at most gain."""
        best: Option | None = None
        for (k, p), n in self.touched.get(t, {}).items():
            q = _plus(self.classes[k], p, size) if n else None
            if q is not None and q in self.gain[k]:
                g = self.gain[k][q] - self.gain[k][p]
                if best is None or g > best[0]:
                    best = (g, k, p, q)
        for k in self.keys.get(t, ()):
            q = _plus(self.classes[k], None, size) if self.avail[k] > 0 else None
            if q is not None and q in self.gain[k] and (best is None or self.gain[k][q] > best[0]):
                best = (self.gain[k][q], k, None, q)
        return best

    def apply(self, opt: Option) -> None:
        _, k, p, q = opt
        touched = self.touched[self._type_of(k)]
        if p is None:
            self.avail[k] -= 1
        else:
            touched[(k, p)] -= 1
        touched[(k, q)] += 1

    def counts(self, into: dict[int, int]) -> None:
        for touched in self.touched.values():
            for (k, p), n in touched.items():
                if n:
                    var = self.classes[k].count[self.classes[k].pats.index(p)]
                    into[var.index] = into.get(var.index, 0) + n


def _plus(cv: _ClassVars, p: Pattern | None, size: int) -> Pattern | None:
    if size not in cv.sizes:
        return None
    q = list(p) if p is not None else [0] * len(cv.sizes)
    q[cv.sizes.index(size)] += 1
    return tuple(q)


def class_greedy_hint(wm: WindowModel) -> None:
    """Hint every variable of `wm` from a class-level greedy placement."""
    cls = wm.classes
    node_cls: dict[Hashable, _ClassVars] = {k: cv for k, cv in wm.node_vars.items()}
    node_avail: dict[Hashable, int] = {k: len(cls.node_classes[k]) for k in wm.node_vars}
    nodes = _Level(node_cls, node_avail, lambda k: k[0])  # type: ignore[index]
    gpu_cls: dict[Hashable, _ClassVars] = {k: cv for k, cv in wm.gpu_vars.items()}
    avail: dict[Hashable, int] = {k: len(cls.gpu_classes[k]) for k in wm.gpu_vars}
    for t, cv in wm.fresh_vars.items():
        gpu_cls[("fresh", t)] = cv
        avail[("fresh", t)] = 0  # grows as node slots are opened to sharing
    gpus = _Level(gpu_cls, avail, lambda k: k[1] if k[0] == "fresh" else k[0])  # type: ignore[index]
    placed: dict[int, str] = {}
    opened: Counter[str] = Counter()
    for j in sorted(wm.types_of):
        job = wm.jobs[j]
        choice: tuple[int, str, list[tuple[_Level, Option]]] | None = None
        for t in wm.types_of[j]:
            steps = _steps(job.gpu_milli, wm.scorer.slot_key(job), t, nodes, gpus)
            if steps is None:
                continue
            gain = wm.jv.value[(j, wm.jv.group[t])] - wm.scorer.type_pen(j, t)
            gain += sum(o[0] for _, o in steps)
            if choice is None or gain > choice[0]:
                choice = (gain, t, steps)
        if choice is None or choice[0] <= 0:
            continue
        _, t, steps = choice
        for level, opt in steps:
            if level is gpus and opt[2] is None and opt[1] == ("fresh", t):
                avail[("fresh", t)] += 1
                opened[t] += 1
            level.apply(opt)
        placed[j] = t
    counts: dict[int, int] = {}
    nodes.counts(counts)
    gpus.counts(counts)
    wm.hint_values(placed, counts, opened)


def _steps(
    milli: int, k: int, t: str, nodes: _Level, gpus: _Level
) -> list[tuple[_Level, Option]] | None:
    """How one job would go on type t (k: its whole-GPU slot key): the options to apply,
    best first; None if it cannot."""
    if milli >= FULL_GPU:
        whole = nodes.best(t, k)
        return None if whole is None else [(nodes, whole)]
    fresh = ("fresh", t)
    ways: list[tuple[int, list[tuple[_Level, Option]]]] = []
    shared = gpus.best(t, milli)
    if shared is not None:
        ways.append((shared[0], [(gpus, shared)]))
    slot = nodes.best(t, 1) if fresh in gpus.classes else None
    q = _plus(gpus.classes[fresh], None, milli) if slot is not None else None
    if slot is not None and q is not None and q in gpus.gain[fresh]:
        open_gpu: Option = (gpus.gain[fresh][q], fresh, None, q)
        ways.append((slot[0] + open_gpu[0], [(nodes, slot), (gpus, open_gpu)]))
    return max(ways, key=lambda w: w[0])[1] if ways else None
