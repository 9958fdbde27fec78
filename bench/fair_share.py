"""What drf's fair-share tie-break changes on a Philly week (docs/design/fair-share.md):

    .venv/bin/python -m bench.fair_share

For each cluster file, the same jobs (submitted 2017-10-01 to 2017-10-08) under
`drf` (dominant share, then the fair-share factor, then FIFO) and `DrfByAllocation`
(dominant share, then FIFO), greedy placement, side by side in one run: how many
jobs start at another time, and avg JCT, avg and max queueing delay.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.scoring.policies.drf import DrfByAllocation
from shared.cluster import load_cluster
from shared.sim import SimConfig, load_jobs, simulate
from shared.traces import SkipStats
from shared.traces._io import parse_time

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / ".." / "shared" / "traces" / "philly" / "philly-sep-oct.csv"
CLUSTERS = ("clusters/philly.yaml", "clusters/philly-tenants.yaml")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--since", default="2017-10-01")
    p.add_argument("--until", default="2017-10-08")
    args = p.parse_args(argv)
    lo, hi = parse_time(args.since), parse_time(args.until)
    print("| cluster | jobs | starts moved | avg JCT s (drf / by allocation) "
          "| avg queue s | max queue s |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in CLUSTERS:
        spec = load_cluster(ROOT / name)
        jobs = [
            j for j in load_jobs(str(TRACE), "philly", spec, SkipStats()) if lo <= j.submit_s < hi
        ]
        runs = {}
        for label, policy in (("drf", make_policy("drf")), ("alloc", DrfByAllocation())):
            r = simulate(jobs, spec, policy, make_placer("greedy"), SimConfig())
            starts = {x.job_id: x.segments[0].start_s for x in r.records if x.segments}
            runs[label] = (starts, r.summary())
        (a, sa), (b, sb) = runs["drf"], runs["alloc"]
        moved = sum(a[j] != b.get(j) for j in a)
        cells = [f"{sa[k]:.0f} / {sb[k]:.0f}" for k in ("avg_jct_s", "avg_queue_s", "max_queue_s")]
        print(f"| {name} | {len(jobs)} | {moved} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
