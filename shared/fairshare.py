"""Fair share from decayed usage: each queue's GPU-seconds, decayed with a half-life,
and Slurm's classic fair-share factor over the two-level queue tree.

Pure arithmetic (no bus, no clock): the simulator and the scoring service keep a
`Ledger` in process (its `SimObservation` offers `fair_share(vc)` to the policies),
and the ledger service keeps the same rows in a faust-streaming table
(services/ledger/).

Usage. A queue's row is (usage, as_of, gpus): its decayed GPU-seconds at time
`as_of`, and the GPUs its running jobs hold since then. With half-life H, usage
decays as u(t) = u(t0) * 2^(-(t - t0)/H), and holding g GPUs over [t0, t] adds
the decayed integral g * (1 - 2^(-(t - t0)/H)) * H / ln 2. This is the limit of
what Slurm's priority/multifactor plugin does in steps of PriorityCalcPeriod
(every period: usage = usage * 2^(-period/H) + the period's new usage), so a
running job counts from its first second, and a half-life after the last job
stopped a queue's usage is exactly half. The default half-life is Slurm's
PriorityDecayHalfLife, 7 days (cluster file: `fair_share: {half_life_h: 168}`).
Times are the messages' clock (virtual in simulation); an event older than the
row's `as_of` (two partitions' events interleaved) counts at `as_of`.

Which queue. A job's usage counts to the queue of its VC (`ClusterSpec.queue_of`);
with no `queues:` in the cluster file, each VC is a queue of its own with weight 1
(the groups `drf` already ranks). A team's usage counts to its org as well.

The factor (Slurm's classic fair-share algorithm, slurm.schedmd.com/
classic_fair_share.html, FairShareDampeningFactor 1), with a queue's `weight` as
its raw shares:
* normalized shares S = (S_queue / S_siblings) * (S_org / S_orgs): siblings are
  the teams of one org (or the top-level queues), each count including itself;
* normalized usage U = U_queue / U_all, the queue's decayed usage over the whole
  cluster's (every top-level queue's);
* effective usage UE: for a top-level queue UE = U; for a team
  UE = U + (UE_org - U) * S_queue / S_siblings (raw shares), so a team inherits
  part of its org's over- or under-use;
* F = 2^(-UE / S), in (0, 1]: 1 with no usage, 0.5 when a queue has used exactly
  its share, smaller above it. S = 0 (weight 0) gives 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.cluster import ClusterSpec, QueueSpec

__all__ = [
    "DEFAULT_HALF_LIFE_S",
    "FairShare",
    "Ledger",
    "Row",
    "factors",
    "ledger_topics",
    "queue_key",
    "row_from_changelog",
    "usage_changelog",
]

DEFAULT_HALF_LIFE_S = 7 * 86400.0  # Slurm's PriorityDecayHalfLife default


@dataclass(frozen=True, slots=True)
class Row:
    """One queue's ledger entry: decayed GPU-seconds at `as_of`, and GPUs held since."""

    usage: float = 0.0
    as_of: float = 0.0
    gpus: float = 0.0

    def at(self, t: float, half_life_s: float) -> float:
        """Decayed usage at `t` (at `as_of` if `t` is earlier)."""
        dt = t - self.as_of
        if dt <= 0:
            return self.usage
        d = 2.0 ** (-dt / half_life_s)
        return self.usage * d + self.gpus * (1.0 - d) * half_life_s / math.log(2.0)

    def change(self, t: float, gpus: float, half_life_s: float) -> Row:
        """The row after the queue's GPUs change by `gpus` at `t`."""
        t = max(t, self.as_of)
        held = self.gpus + gpus
        return Row(self.at(t, half_life_s), t, held if held > 1e-9 else 0.0)


def queue_key(cluster: ClusterSpec | None, vc: str) -> str:
    """The ledger's key for a job of `vc`: its queue, or the VC itself when the
    cluster file has no queues."""
    if cluster is None or not cluster.queues:
        return vc
    return cluster.queue_of(vc)


class Ledger:
    """Decayed usage per queue, in process (the rows of the ledger table)."""

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half-life must be positive, got {half_life_s!r}")
        self.half_life_s = half_life_s
        self.rows: dict[str, Row] = {}

    def change(self, queue: str, t: float, gpus: float) -> None:
        """`queue`'s running jobs hold `gpus` more (negative: fewer) from `t` on."""
        self.rows[queue] = self.rows.get(queue, Row(as_of=t)).change(t, gpus, self.half_life_s)

    def usage(self, queue: str, t: float) -> float:
        row = self.rows.get(queue)
        return 0.0 if row is None else row.at(t, self.half_life_s)

    def usages(self, t: float) -> dict[str, float]:
        return {q: r.at(t, self.half_life_s) for q, r in self.rows.items()}

    def factors(self, queues: Mapping[str, QueueSpec], t: float) -> dict[str, float]:
        """The fair-share factor of every queue with usage or in `queues`, at `t`."""
        return factors(self.usages(t), queues)


def factors(
    usage: Mapping[str, float],
    queues: Mapping[str, QueueSpec],
    names: Iterable[str] = (),
) -> dict[str, float]:
    """Slurm's classic fair-share factor (module docstring) of every queue named in
    `usage`, `queues` or `names`. `usage` is each queue's own decayed usage (a team's
    is not yet in its org's: it is added here). A name `queues` does not know is a
    top-level queue of weight 1."""
    known = dict.fromkeys([*queues, *usage, *names])

    def parent(q: str) -> str | None:
        spec = queues.get(q)
        return spec.parent if spec is not None else None

    def weight(q: str) -> float:
        spec = queues.get(q)
        return max(spec.weight, 0.0) if spec is not None else 1.0

    total_usage = {q: max(usage.get(q, 0.0), 0.0) for q in known}  # own, then + teams
    for q in known:
        p = parent(q)
        if p is not None:
            total_usage[p] = total_usage.get(p, 0.0) + max(usage.get(q, 0.0), 0.0)
    siblings: dict[str | None, float] = {}  # raw shares under each parent (None: root)
    for q in known:
        siblings[parent(q)] = siblings.get(parent(q), 0.0) + weight(q)
    u_all = sum(u for q, u in total_usage.items() if parent(q) is None)

    def norm_shares(q: str) -> float:
        p = parent(q)
        s_sib = siblings.get(p, 0.0)
        s = weight(q) / s_sib if s_sib > 0 else 0.0
        return s if p is None else s * norm_shares(p)

    def effective(q: str) -> float:
        u = total_usage.get(q, 0.0) / u_all if u_all > 0 else 0.0
        p = parent(q)
        if p is None:
            return u
        s_sib = siblings.get(p, 0.0)
        frac = weight(q) / s_sib if s_sib > 0 else 0.0
        return u + (effective(p) - u) * frac

    out: dict[str, float] = {}
    for q in known:
        s = norm_shares(q)
        ue = effective(q)
        out[q] = 0.0 if s <= 0 else 2.0 ** (-ue / s)
    return out


class FairShare:
    """A cluster's ledger and the factor of a job's queue, as the policies read it
    (`SimObservation.fair_share`): the factors are computed once per time asked."""

    def __init__(self, cluster: ClusterSpec | None) -> None:
        self.cluster = cluster
        self.ledger = Ledger(cluster.half_life_s if cluster is not None else DEFAULT_HALF_LIFE_S)
        self.external = False  # rows come from the ledger table (`load`), not `change`
        self._at: float | None = None
        self._factors: dict[str, float] = {}

    def change(self, vc: str, t: float, gpus: float) -> None:
        """A job of `vc` took (`gpus` > 0) or gave back GPUs at `t`."""
        if self.external:
            return
        self.ledger.change(queue_key(self.cluster, vc), t, gpus)
        self._at = None

    def load(self, queue: str, row: Row) -> None:
        """A row of the ledger service's table (its changelog): from now on the rows
        come from there, and `change` is ignored."""
        self.external = True
        self.ledger.rows[queue] = row
        self._at = None

    def factors(self, t: float) -> dict[str, float]:
        if self._at != t:
            queues = self.cluster.queues if self.cluster is not None else {}
            self._factors = self.ledger.factors(queues, t)
            self._at = t
        return self._factors

    def factor(self, vc: str, t: float) -> float:
        """The fair-share factor of `vc`'s queue at `t` (1: no usage anywhere)."""
        return self.factors(t).get(queue_key(self.cluster, vc), 1.0)


def usage_changelog(prefix: str) -> str:
    """The changelog topic of the ledger service's `usage` table (faust names it
    `<app id>-<table>-changelog`; the app id is `<prefix>ledger`)."""
    return f"{prefix}ledger-usage-changelog"


def ledger_topics(prefix: str) -> list[str]:
    """Every topic faust makes for the ledger service (app id `<prefix>ledger`): the
    `jobs` and `usage` tables' changelogs and the leader assignor's topic
    (`<app id>-__assignor-__leader`). Its principal owns these (shared/acl.py)."""
    return [
        f"{prefix}ledger-jobs-changelog",
        usage_changelog(prefix),
        f"{prefix}ledger-__assignor-__leader",
    ]


def row_from_changelog(key: bytes | None, value: bytes | None) -> tuple[str, Row] | None:
    """One record of the `usage` changelog as (queue, row); None if it is not one
    (faust writes keys and values as JSON)."""
    try:
        queue = json.loads(key or b"")
        v = json.loads(value or b"")
        if not isinstance(queue, str) or not isinstance(v, dict):
            return None
        return queue, Row(float(v["usage"]), float(v["as_of"]), float(v["gpus"]))
    except (ValueError, KeyError, TypeError):
        return None
