"""The validation episodes a trainer picks its checkpoint on.

Checkpoints are told apart only by episodes where the order of the queue
matters and which look like what the policy is judged on. So each validation
world (a part's `val:` range) gets its episodes in turn, and within a world:

- **distinct job windows**: the world's jobs are cut into as many strata as it
  has episodes, and episode `slot` starts at a seeded offset inside its stratum,
  so that (when the stratum holds `prefix + jobs` jobs) no two episodes share a
  job; each has its own thinning seed too. An episode that `fill_load` sizes past
  `prefix + jobs` (env.episode_size: Philly's) may reach into the next stratum;
- **loads spread over what training draws**: a world's first episode runs at
  the part's recorded load (`part_load`: `demand` of the whole range over the
  cluster's `capacity`, as the trainer measures an episode's load), the others
  of all worlds at loads evenly spaced over [load_lo, load_hi] (`slot_loads`);
- **no episode where nothing queues**: every heuristic is run on each candidate
  (the prefix included, as the bar of the validation score is each episode's best
  heuristic); a candidate where all of them are within `NO_QUEUE_TOL` of each
  other cannot rank anything, so it is dropped, counted, and drawn again in its
  stratum at the same load (a new offset and seed), at most `MAX_DRAWS` times.

Everything is drawn from `seed`, the episode's world and slot, and the draw
number: the same seed gives the same episodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from services.scoring.rl.env import EpisodeConfig, EpisodeSpec, build_episode, demand
from shared.cluster import ClusterSpec
from shared.sim.load import capacity
from shared.traces import TraceJob

__all__ = [
    "MAX_DRAWS",
    "NO_QUEUE_TOL",
    "ValSet",
    "episode_load",
    "part_load",
    "slot_loads",
    "validation_set",
]

NO_QUEUE_TOL = 1e-3  # every heuristic within 0.1% of each other: the order did not matter
MAX_DRAWS = 4  # candidates tried per episode before its slot is given up


@dataclass
class ValSet:
    specs: list[EpisodeSpec]
    best_heuristic: list[str]
    best_obj: list[float]
    objs: dict[str, list[float]]  # every heuristic's objective on each kept episode
    loads: list[float]  # each kept episode's load as built (`episode_load`)
    dropped: int = 0  # candidates where nothing queued (NO_QUEUE_TOL)
    given_up: list[tuple[int, int]] = field(default_factory=list)  # (world, slot) left empty


def part_load(jobs: Sequence[TraceJob], cluster: ClusterSpec) -> float:
    """A part's recorded load: `demand` of its jobs over the cluster's capacity."""
    return demand(jobs) / capacity(cluster)


def episode_load(
    trace: Sequence[TraceJob], cluster: ClusterSpec, spec: EpisodeSpec, cfg: EpisodeConfig
) -> float:
    """The load of an episode as built (thinned or compressed): `demand` / capacity."""
    jobs, _ = build_episode(trace, cluster, spec, cfg)
    return demand(jobs) / capacity(cluster)


def slot_loads(
    per_world: Sequence[int], lo: float, hi: float, recorded: Sequence[float]
) -> list[list[float]]:
    """The loads of each world's episodes (`per_world[w]` of them): its first at the
    world's recorded load, the rest of all worlds together evenly spaced over
    [lo, hi], taken by the worlds in turn (a world of one episode: the recorded load)."""
    rest = [(w, j) for j in range(1, max(per_world, default=0)) for w in range(len(per_world))
            if j < per_world[w]]  # fmt: skip
    grid = np.linspace(lo, hi, len(rest)) if len(rest) > 1 else np.array([(lo + hi) / 2])
    out = [[recorded[w]] if k > 0 else [] for w, k in enumerate(per_world)]
    for (w, _), load in zip(rest, grid, strict=False):
        out[w].append(float(load))
    return out


def _candidate(
    world: int, n: int, k: int, slot: int, load: float, want: int, seed: Sequence[int], draw: int
) -> EpisodeSpec:
    """Draw `draw` of slot `slot` of a world of `n` jobs cut into `k` strata."""
    rng = np.random.default_rng([*seed, world, slot, draw])
    last = max(n - want, 0)  # the latest start that still holds a whole episode
    lo = min(int(slot * n / k), last)
    hi = min(max(lo, int((slot + 1) * n / k) - want), last)
    return EpisodeSpec(world, int(rng.integers(lo, hi + 1)), load, int(rng.integers(2**31 - 1)))


def validation_set(
    traces: Sequence[Sequence[TraceJob]],
    clusters: Sequence[ClusterSpec],
    cfg: EpisodeConfig,
    count: int,
    seed: Sequence[int],
    heuristic_objs: Callable[[list[EpisodeSpec], str], list[float]],
    heuristics: Sequence[str],
    max_draws: int = MAX_DRAWS,
) -> ValSet:
    """`count` validation episodes over the worlds (`traces[i]` on `clusters[i]`), the
    module doc's rules, at loads over [cfg.load_lo, cfg.load_hi] and each world's
    recorded load. `heuristic_objs(specs, h)`: heuristic h's objective on each spec."""
    n_w = len(traces)
    per_world = [count // n_w + (1 if w < count % n_w else 0) for w in range(n_w)]
    recorded = [part_load(traces[w], clusters[w]) for w in range(n_w)]
    loads = slot_loads(per_world, cfg.load_lo, cfg.load_hi, recorded)
    # episode i: world i % n_w, slot i // n_w (the worlds in turn)
    slots = [(i % n_w, i // n_w) for i in range(count)]
    want = cfg.prefix + cfg.jobs
    kept: dict[int, tuple[EpisodeSpec, dict[str, float]]] = {}
    dropped, pending = 0, list(range(count))
    for draw in range(max_draws):
        if not pending:
            break
        specs = [
            _candidate(w, len(traces[w]), per_world[w], s, loads[w][s], want, seed, draw)
            for w, s in (slots[i] for i in pending)
        ]
        objs = {h: heuristic_objs(specs, h) for h in heuristics}
        still = []
        for j, i in enumerate(pending):
            row = {h: objs[h][j] for h in heuristics}
            if _no_queue(list(row.values())):
                dropped += 1
                still.append(i)
            else:
                kept[i] = (specs[j], row)
        pending = still
    order = sorted(kept)
    util = cfg.objective == "util"
    best = [
        (max if util else min)(kept[i][1].items(), key=lambda kv: _key(kv[1], util)) for i in order
    ]
    return ValSet(
        specs=[kept[i][0] for i in order],
        best_heuristic=[b[0] for b in best],
        best_obj=[b[1] for b in best],
        objs={h: [kept[i][1][h] for i in order] for h in heuristics},
        loads=[
            episode_load(traces[kept[i][0].cluster], clusters[kept[i][0].cluster], kept[i][0], cfg)
            for i in order
        ],
        dropped=dropped,
        given_up=[slots[i] for i in pending],
    )


def _key(v: float, util: bool) -> float:
    """Order of objectives for the best: non-finite ones never win."""
    if not math.isfinite(v):
        return -math.inf if util else math.inf
    return v


def _no_queue(values: Sequence[float]) -> bool:
    """Every heuristic within NO_QUEUE_TOL of each other (all finite and positive)."""
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        return False
    return max(values) <= min(values) * (1 + NO_QUEUE_TOL)
