"""Choosing a learned policy without looking at the held-out weeks
(docs/results/rl-selection.md).

Three fixed protocols, each a list of settings run over several orders of the jobs
submitted in one second (`bench.tie_orders.shuffled`), MILP placement, `easy`:

* `validation` chooses: Philly jobs of 2017-10-05..10-10 and 10-10..10-15 (after
  the training jobs' validation split, never trained on) on
  `clusters/val/t4-p100-a100.yaml` (a shape no training or held-out cluster has),
  arrivals compressed to loads 0.9 and 1.2, orders trace, 1, 2: 12 runs.
* `heldout` reports: Philly from 2017-10-15 on `clusters/philly-hetero.yaml`
  (load 0.95 as traced), orders trace, 1, 2, 3.
* `small` reports: the same on `clusters/philly-hetero-small.yaml` (load 1.18).

    .venv/bin/python -m bench.rl_selection --protocol validation \\
        --policies drf,fifo,rl,rl:PATH > runs.jsonl
    .venv/bin/python -m bench.rl_selection --report runs.jsonl [more.jsonl ...]

Each run prints one JSON line (setting, order, policy, avg bounded slowdown, avg
JCT, utilisation over the submission span, the 16+ GPU jobs' max queueing delay).
`--report` reads such lines (from one run or several run side by side) and prints,
per protocol and policy, the mean of its per-run ratios of avg bounded slowdown to
`drf`'s, its mean avg JCT and utilisation, and in how many settings its 16+ GPU
jobs waited longer at most than under EASY `fifo` in the same order: the figures
the issue's target is stated in. A policy is chosen on `validation` alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from bench.tie_orders import TRACE, shuffled
from rltune import simulate as cli
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.sim import simulate
from shared.traces import SkipStats


@dataclass(frozen=True)
class Setting:
    cluster: str
    since: str
    until: str
    load: str  # "" = as traced

    @property
    def key(self) -> str:
        return f"{self.cluster}|{self.since}..{self.until or 'end'}|load {self.load or 'traced'}"


VAL_CLUSTER = "clusters/val/t4-p100-a100.yaml"
PROTOCOLS: dict[str, tuple[tuple[Setting, ...], tuple[int, ...]]] = {
    "validation": (
        tuple(
            Setting(VAL_CLUSTER, since, until, load)
            for since, until in (("2017-10-05", "2017-10-10"), ("2017-10-10", "2017-10-15"))
            for load in ("0.9", "1.2")
        ),
        (-1, 1, 2),
    ),
    "heldout": ((Setting("clusters/philly-hetero.yaml", "2017-10-15", "", ""),), (-1, 1, 2, 3)),
    "small": ((Setting("clusters/philly-hetero-small.yaml", "2017-10-15", "", ""),), (-1, 1, 2, 3)),
}
BIG = "16+"  # the size bucket of the large-job target
TOP = 60.0  # the plot's bars stop here (fifo's are +150-260%); their labels say how far
TOP_H = 40.0  # the same for the hours past fifo's max wait


def run(protocol: str, policies: list[str], trace: str) -> None:
    settings, seeds = PROTOCOLS[protocol]
    sub = argparse.ArgumentParser().add_subparsers()
    cli.register(sub)
    parser = sub.choices["simulate"]
    for st in settings:
        extra = ["--until", st.until] if st.until else []
        extra += ["--load", st.load] if st.load else []
        args = parser.parse_args(["--trace", trace, "--format", "philly", "--cluster", st.cluster,
                                  "--since", st.since, "--policy", "fifo", "--placer", "milp",
                                  *extra])  # fmt: skip
        cluster = cli.load_run_cluster(args)
        jobs = cli.load_run_jobs(args, cluster, SkipStats())
        for seed in seeds:
            order = shuffled(jobs, seed)
            for name in policies:
                with cli._LazyProgress(f"{name} {st.key} order {seed}") as bar:
                    res = simulate(order, cluster, make_policy(name),
                                   make_placer("milp", reproducible=True), cli.sim_config(args),
                                   bar.tick)  # fmt: skip
                s = res.summary()
                big = cast(dict[str, dict[str, float]], s["queue_by_size"])[BIG]
                row = {"protocol": protocol, "setting": st.key, "seed": seed, "policy": name,
                       "avg_bsld": s["avg_bsld"], "avg_jct_h": cast(float, s["avg_jct_s"]) / 3600,
                       "gpu_util": s["gpu_util"], "big_max_wait_h": big["max_s"] / 3600,
                       "sim_s": round(res.wall_s, 1)}  # fmt: skip
                print(json.dumps(row), flush=True)


def summarise(rows: list[dict[str, object]], against: str = "drf") -> dict[str, dict[str, dict]]:
    """Per protocol and policy: `ratio` (mean over runs of avg_bsld / `against`'s in
    the same setting and order, minus 1), `jct_h`, `util` (means), `runs`, and
    `big_worse` (runs whose 16+ GPU max wait exceeds EASY fifo's in the same
    setting and order; None without fifo runs) and `big_excess_h` (the largest of
    those differences in hours, negative when always below fifo's)."""
    by: dict[tuple[str, str, int], dict[str, dict[str, object]]] = defaultdict(dict)
    for r in rows:
        by[(str(r["protocol"]), str(r["setting"]), int(cast(int, r["seed"])))][str(r["policy"])] = r
    acc: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for (protocol, _, _), runs in by.items():
        ref = runs.get(against)
        fifo = runs.get("fifo")
        for name, r in runs.items():
            a = acc[protocol][name]
            if ref is not None:
                a["ratio"].append(
                    float(cast(float, r["avg_bsld"])) / float(cast(float, ref["avg_bsld"]))
                )
            a["jct_h"].append(float(cast(float, r["avg_jct_h"])))
            a["util"].append(float(cast(float, r["gpu_util"])))
            if fifo is not None:
                worse = (
                    float(cast(float, r["big_max_wait_h"]))
                    > float(cast(float, fifo["big_max_wait_h"])) + 1e-9
                )
                a["big_worse"].append(float(worse))
                a["big_excess"].append(
                    float(cast(float, r["big_max_wait_h"]))
                    - float(cast(float, fifo["big_max_wait_h"]))
                )
    out: dict[str, dict[str, dict]] = {}
    for protocol, pols in acc.items():
        out[protocol] = {}
        for name, a in pols.items():
            out[protocol][name] = {
                "ratio": float(np.mean(a["ratio"])) - 1 if a["ratio"] else None,
                "jct_h": float(np.mean(a["jct_h"])),
                "util": float(np.mean(a["util"])),
                "runs": len(a["jct_h"]),
                "big_worse": int(sum(a["big_worse"])) if a["big_worse"] else None,
                "big_excess_h": max(a["big_excess"]) if a["big_excess"] else None,
            }
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rl_selection", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--protocol", choices=sorted(PROTOCOLS), default="validation")
    p.add_argument("--policies", default="drf,fifo,rl")
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--report", nargs="+", default=[], help="summarise these JSON-lines files")
    p.add_argument("--plot", default="", help="with --report: a bar chart of the ratios (PNG)")
    p.add_argument(
        "--only", default="", help="with --report: only these policies (comma-separated)"
    )
    a = p.parse_args(argv)
    if not a.report:
        run(a.protocol, a.policies.split(","), a.trace)
        return 0
    rows = [
        json.loads(line)
        for f in a.report
        for line in Path(f).read_text().splitlines()
        if line.startswith("{")
    ]
    if a.only:
        keep = set(a.only.split(","))
        rows = [r for r in rows if r["policy"] in keep]
    for protocol, pols in summarise(rows).items():
        print(f"{protocol}: avg bsld vs drf (mean of per-run ratios), mean avg JCT, mean util, "
              f"runs whose 16+ GPU max wait exceeds EASY fifo's")  # fmt: skip
        for name, s in sorted(pols.items(), key=lambda kv: kv[1]["ratio"] or 0.0):
            ratio = "n/a" if s["ratio"] is None else f"{s['ratio']:+.1%}"
            excess = "" if s["big_excess_h"] is None else f" (at most {s['big_excess_h']:+.1f} h)"
            print(f"  {name:36s} {ratio:>7s}  JCT {s['jct_h']:.3f} h  util {s['util']:.3f}  "
                  f"16+ worse than fifo: {s['big_worse']}/{s['runs']}{excess}")  # fmt: skip
    if a.plot:
        plot(summarise(rows), Path(a.plot))
    return 0


def plot(summary: dict[str, dict[str, dict]], out: Path) -> None:
    """Above: each policy's mean ratio of avg bounded slowdown to drf's; below: the
    most its 16+ GPU jobs' max wait went past EASY fifo's in one run (hours, negative:
    always under). One group of bars per protocol, policies in the order of their
    validation ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protocols = [p for p in ("validation", "heldout", "small") if p in summary]
    names = sorted(
        {n for p in protocols for n in summary[p]},
        key=lambda n: summary.get("validation", {}).get(n, {}).get("ratio") or 0.0,
    )
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    width = 0.8 / max(len(protocols), 1)
    xs0 = range(len(names))
    for i, p in enumerate(protocols):
        xs = [k + i * width for k in xs0]
        ys = [100 * _num(summary[p].get(n, {}).get("ratio")) for n in names]
        ax.bar(xs, [min(y, TOP) for y in ys], width, label=p)
        hs = [_num(summary[p].get(n, {}).get("big_excess_h")) for n in names]
        bx.bar(xs, [max(min(h, TOP_H), -TOP_H) for h in hs], width, label=p)
        for x, y, h in zip(xs, ys, hs, strict=True):
            if y == y:  # not NaN: label every bar, the clipped ones with their value
                ax.text(x, min(y, TOP), f"{y:+.0f}", ha="center", fontsize=6,
                        va="bottom" if y >= 0 else "top")  # fmt: skip
            if h == h:
                bx.text(x, max(min(h, TOP_H), -TOP_H), f"{h:+.1f}", ha="center", fontsize=6,
                        va="bottom" if h >= 0 else "top")  # fmt: skip
    ax.set_ylim(-30, TOP + 8)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(-10, color="grey", ls="--", lw=0.8, label="target: -10%")
    ax.set(ylabel="avg bounded slowdown vs drf (%)",
           title="mean of per-run ratios to drf (same setting, same order of ties)")  # fmt: skip
    ax.legend(fontsize=8)
    bx.axhline(0, color="black", lw=0.8)
    bx.set_ylim(-TOP_H - 4, TOP_H + 4)
    bx.set(ylabel="16+ GPU max wait - EASY fifo's,\nworst run (h; > 0 misses the target)")
    bx.set_xticks([k + width * (len(protocols) - 1) / 2 for k in xs0])
    bx.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _num(x: float | None) -> float:
    return float("nan") if x is None else float(x)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
