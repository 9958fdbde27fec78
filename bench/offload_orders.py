"""How much of "no group's avg JCT higher" is the placer's, and how much chance's?

The offload join's target compares two placers on one run: the offload-aware one
must cut the offloading jobs' migration slowdown by 30% without raising the avg JCT
of the offloading jobs, of the others, or of all. A queue is chaotic: any change to
one start moves many others. This runs, for each marking seed (which jobs offload,
as `rltune bench offload_placement --seed`), every placer over several orders of
same-second submissions (the trace's, and seeded permutations within each second,
as `bench.tie_orders`; the marking is drawn first, so the same jobs offload in every
order), and reports:

* the placebo: the same placer (`--placebo`, default `milp`) in two orders, paired
  each with the next: how far each group's avg JCT moves when nothing but the order
  of same-second submissions changed, and how often "no group higher" fails;
* per (seed, order) and per seed over the orders' mean, whether each other placer
  meets the whole target against the placebo placer.

    .venv/bin/python -m bench.offload_orders --seeds 0-9 --orders trace,1,2,3 \\
        [--placers milp,milp+offload+replace] [--out DIR] \\
        [--cluster clusters/philly.yaml] [--since 2017-10-15] [--until DATE]

(`--since` / `--until` pick the slice as `rltune simulate` does, before `--limit`.)

One JSON line per run on stdout (or `--out DIR/runs.jsonl`), the summary on stderr,
`--out DIR/offload_orders.png` the placebo's moves beside the placers' changes;
`--report runs.jsonl` summarises saved runs without running anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.offload_placement import others_avg_jct_s
from bench.tie_orders import shuffled
from rltune.simulate import load_run_jobs
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cluster import load_cluster
from shared.sched.replacement import ReplaceConfig
from shared.sim import SimConfig, simulate
from shared.sim.offload_jobs import mark_offloading
from shared.traces import SkipStats

GROUPS = ("others", "offloading", "all")
TITLES = {"others": "jobs that do not offload", "offloading": "offloading jobs", "all": "all jobs"}
CUT = 0.30  # the target: migration slowdown cut by at least this much


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def run_one(jobs: list[Any], cluster: Any, placer: str, seed: int) -> dict[str, float]:
    res = simulate(jobs, cluster, make_policy("fifo"),
                   make_placer(placer, reproducible=True, replace=ReplaceConfig()),
                   SimConfig(seed=seed))  # fmt: skip
    s = res.summary()
    return {
        "others": others_avg_jct_s(res.records),
        "offloading": float(s["offload_avg_jct_s"]),  # type: ignore[arg-type]
        "all": float(s["avg_jct_s"]),  # type: ignore[arg-type]
        "slowdown": float(s["offload_slowdown"]),  # type: ignore[arg-type]
    }


def whole_target(new: dict[str, float], base: dict[str, float]) -> bool:
    cut = 1 - new["slowdown"] / base["slowdown"]
    return cut >= CUT and all(new[g] <= base[g] for g in GROUPS)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.offload_orders", description=__doc__)
    p.add_argument("--trace", default="../shared/traces/philly/philly-sep-oct.csv")
    p.add_argument("--format", default="philly")
    p.add_argument("--cluster", default="clusters/philly.yaml")
    p.add_argument("--limit", type=int, default=8000)
    p.add_argument("--since", default="", help="only jobs submitted from then (as simulate)")
    p.add_argument("--until", default="", help="only jobs submitted before then")
    p.add_argument("--fraction", type=float, default=0.3)
    p.add_argument("--seeds", default="0-9", help="marking seeds, e.g. 0-9 or 0,3,5")
    p.add_argument("--orders", default="trace,1,2,3", help="`trace`: the trace's order")
    p.add_argument("--placebo", default="milp")
    p.add_argument("--placers", default="milp+offload+replace")
    p.add_argument("--out", default="")
    p.add_argument("--report", default="", help="summarise these saved JSON lines")
    a = p.parse_args(argv)
    if a.report:
        rows = [json.loads(line) for line in Path(a.report).read_text().splitlines() if line]
        summarise(rows, a.placebo, str(Path(a.out) / "offload_orders.png") if a.out else "")
        return 0
    a.load = None
    cluster = load_cluster(a.cluster)
    base_jobs = load_run_jobs(a, cluster, SkipStats())
    names = [a.placebo, *[n for n in a.placers.split(",") if n and n != a.placebo]]
    out = Path(a.out) if a.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    sink = (out / "runs.jsonl").open("w") if out is not None else sys.stdout
    rows = []
    for seed in _seeds(a.seeds):
        marked = mark_offloading(base_jobs, a.fraction, seed)  # before any reordering
        for order in a.orders.split(","):
            jobs = shuffled(marked, -1 if order == "trace" else int(order))
            for name in names:
                row = {"seed": seed, "order": order, "placer": name,
                       **run_one(jobs, cluster, name, seed)}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), file=sink, flush=True)
            print(f"seed {seed} order {order} done", file=sys.stderr, flush=True)
    if out is not None:
        sink.close()
    summarise(rows, a.placebo, str(out / "offload_orders.png") if out is not None else "")
    return 0


def summarise(rows: list[dict[str, Any]], placebo: str, plot: str) -> None:
    by: dict[tuple[int, str, str], dict[str, float]] = {
        (r["seed"], r["order"], r["placer"]): r for r in rows
    }
    orders = list(dict.fromkeys(r["order"] for r in rows))
    placers = [p for p in dict.fromkeys(r["placer"] for r in rows) if p != placebo]
    # seeds with every run there (a run stopped part-way leaves its last seed out)
    seeds = sorted(
        s
        for s in {r["seed"] for r in rows}
        if all((s, o, n) in by for o in orders for n in (placebo, *placers))
    )
    # placebo: the same placer, consecutive orders paired (and the last with the first)
    moves: dict[str, list[float]] = defaultdict(list)
    fails = pairs = 0
    for s in seeds:
        for i, o in enumerate(orders):
            if len(orders) < 2 or (len(orders) == 2 and i == 1):
                continue  # two orders make one pair (the reverse would count it twice)
            o2 = orders[(i + 1) % len(orders)]
            x, y = by[(s, o, placebo)], by[(s, o2, placebo)]
            for g in GROUPS:
                moves[g].append(y[g] / x[g] - 1)
            pairs += 1
            fails += any(y[g] > x[g] for g in GROUPS)
    print(f"placebo: {placebo} in two orders of same-second submissions, {pairs} pairs "
          f"over {len(seeds)} seeds:", file=sys.stderr)  # fmt: skip
    for g in GROUPS:
        v = np.abs(moves[g]) if moves[g] else np.zeros(1)
        print(f"  {g:10s} avg JCT moves by |median| {np.median(v):.1%}, max {v.max():.1%}",
              file=sys.stderr)  # fmt: skip
    if pairs:
        print(f"  'no group higher' fails in {fails} of {pairs} pairs with nothing changed "
              f"but the order", file=sys.stderr)  # fmt: skip
    changes: dict[str, dict[str, list[float]]] = {}
    for name in placers:
        per_run = [whole_target(by[(s, o, name)], by[(s, o, placebo)])
                   for s in seeds for o in orders]  # fmt: skip
        mean_ok = 0
        changes[name] = defaultdict(list)
        table = [
            f"  | seed | {placebo} slowdown | {name} slowdown | cut | "
            + " | ".join(TITLES[g] for g in GROUPS)
            + f" | whole target per order ({', '.join(orders)}) |"
        ]
        for s in seeds:
            new = {k: float(np.mean([by[(s, o, name)][k] for o in orders]))
                   for k in (*GROUPS, "slowdown")}  # fmt: skip
            base = {k: float(np.mean([by[(s, o, placebo)][k] for o in orders]))
                    for k in (*GROUPS, "slowdown")}  # fmt: skip
            mean_ok += whole_target(new, base)
            for g in (*GROUPS, "slowdown"):
                changes[name][g].append(new[g] / base[g] - 1)
            marks = "".join(
                "y" if whole_target(by[(s, o, name)], by[(s, o, placebo)]) else "n" for o in orders
            )
            table.append(
                f"  | {s} | {base['slowdown']:.3f} | {new['slowdown']:.3f} | "
                f"{1 - new['slowdown'] / base['slowdown']:.1%} | "
                + " | ".join(f"{new[g] / base[g] - 1:+.1%}" for g in GROUPS)
                + f" | {marks} |"
            )
        print(f"{name} against {placebo}: whole target (cut >= {CUT:.0%}, no group's avg "
              f"JCT higher) in {sum(per_run)} of {len(per_run)} runs (seed x order); on "
              f"each seed's mean over the {len(orders)} orders: {mean_ok} of {len(seeds)} "
              f"seeds", file=sys.stderr)  # fmt: skip
        for g in (*GROUPS, "slowdown"):
            c = changes[name][g]
            print(f"  {g:10s} mean over orders vs {placebo}: median {np.median(c):+.1%}, "
                  f"worst seed {max(c):+.1%}", file=sys.stderr)  # fmt: skip
        print(f"  per seed, means over the orders (changes against {placebo}):",
              file=sys.stderr)  # fmt: skip
        print("\n".join(table), file=sys.stderr)
    if plot:
        _plot(moves, changes, placebo, plot)


def _plot(
    moves: dict[str, list[float]], changes: dict[str, dict[str, list[float]]], placebo: str,
    path: str,
) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(GROUPS), figsize=(12, 3.8), sharey=True)
    for ax, g in zip(axes, GROUPS, strict=True):
        series = [(f"{placebo}: order only", moves[g])]
        series += [(f"{n}\n(mean over orders)", c[g]) for n, c in changes.items()]
        for i, (_label, v) in enumerate(series):
            ax.scatter([i] * len(v), [x * 100 for x in v], s=12)
        ax.axhline(0, color="grey", lw=1)
        ax.set_xticks(range(len(series)), [s[0] for s in series], fontsize=7)
        ax.set_title(f"avg JCT, {TITLES[g]}", fontsize=9)
    axes[0].set_ylabel(f"change vs {placebo} (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
