"""Priority preemption on a Philly slice: what `preempt_lower` buys the high class
and costs the rest.

Every `--every`-th job of the first `--jobs` of the Philly trace is of class
`high` (priority 10), the rest `low` (priority 0); the same trace runs twice
through `rltune simulate`, with `high`'s `preempt_lower` off and on, on the
cluster file given (its queues kept). Per class, from the per-job CSV alone:
jobs, average JCT and queueing delay (first start - submit), in hours; and the
summary's preemptions by reason and GPU-hours lost to restarts.

    .venv/bin/python -m bench.priority --jobs 2000 --cluster clusters/philly-hetero-small.yaml
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import yaml

from shared.cluster import load_cluster
from shared.replay import job_spec_of
from shared.sim import load_jobs
from shared.traces import SkipStats

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "philly"
CLUSTER = Path(__file__).resolve().parents[1] / "clusters" / "philly-hetero-small.yaml"


def classed_trace(cluster: Path, jobs: int, every: int, out: Path) -> dict[str, str]:
    """The first `jobs` Philly jobs as JSON lines, every `every`-th of class high."""
    trace = load_jobs(
        TRACE / "philly-sep-oct.csv", "philly", load_cluster(cluster), SkipStats(), jobs
    )
    classes: dict[str, str] = {}
    with out.open("w") as fh:
        for i, j in enumerate(trace):
            c = "high" if i % every == every - 1 else "low"
            classes[j.job_id] = c
            spec = job_spec_of(dataclasses.replace(j, priority_class=c))
            spec.submit_time = j.submit_s
            line = msgspec.to_builtins(spec) | {"duration_s": j.duration_s}
            fh.write(msgspec.json.encode(line).decode() + "\n")
    return classes


def per_class(rows: list[dict[str, str]], classes: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per class: jobs that ran, avg JCT and avg queueing delay (hours), from
    per-segment rows (a rejected job's row has no start)."""
    first: dict[str, dict[str, str]] = {}
    last: dict[str, dict[str, str]] = {}
    for r in rows:
        if not r["start_s"]:
            continue  # rejected: never ran
        first.setdefault(r["job_id"], r)
        last[r["job_id"]] = r
    out: dict[str, dict[str, float]] = {}
    for c in sorted(set(classes.values())):
        ids = [j for j in first if classes[j] == c]
        if not ids:
            continue
        jct = sum(float(last[j]["finish_s"]) - float(first[j]["submit_s"]) for j in ids)
        wait = sum(float(first[j]["start_s"]) - float(first[j]["submit_s"]) for j in ids)
        out[c] = {"jobs": len(ids), "avg_jct_h": jct / len(ids) / 3600,
                  "avg_wait_h": wait / len(ids) / 3600}  # fmt: skip
    return out


def run(cluster: Path, jobs: int, every: int, policy: str, out: Path) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.jsonl"
    classes = classed_trace(cluster, jobs, every, trace)
    rltune = str(Path(sys.executable).parent / "rltune")
    results: dict[str, object] = {}
    for on in (False, True):
        data = yaml.safe_load(cluster.read_text())
        data["priority_classes"] = {
            "low": {"priority": 0}, "high": {"priority": 10, "preempt_lower": on},
        }  # fmt: skip
        name = "on" if on else "off"
        spec, csv_out, js = out / f"cluster-{name}.yaml", out / f"{name}.csv", out / f"{name}.json"
        spec.write_text(yaml.safe_dump(data))
        subprocess.run(
            [rltune, "simulate", "--trace", str(trace), "--format", "jsonl", "--cluster",
             str(spec), "--policy", policy, "--placer", "greedy", "--jobs-out", str(csv_out),
             "--json", str(js)],
            check=True, capture_output=True,
        )  # fmt: skip
        summary = json.loads(js.read_text())
        with csv_out.open() as fh:
            rows = list(csv.DictReader(fh))
        results[name] = {
            "classes": per_class(rows, classes),
            "preemptions_by_reason": summary.get("preemptions_by_reason", {}),
            "restart_lost_gpu_h": summary.get("restart_lost_gpu_h", 0.0),
        }
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--every", type=int, default=10, help="every N-th job is of class high")
    ap.add_argument("--cluster", type=Path, default=CLUSTER)
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--out", type=Path, default=Path("out/priority"))
    args = ap.parse_args(argv)
    res = run(args.cluster, args.jobs, args.every, args.policy, args.out)
    (args.out / "priority.json").write_text(json.dumps(res, indent=1))
    for name, r in res.items():
        assert isinstance(r, dict)
        print(f"preempt_lower {name}: preemptions {r['preemptions_by_reason']}, "
              f"restart loss {r['restart_lost_gpu_h']:.1f} GPU-h")  # fmt: skip
        for c, f in r["classes"].items():
            print(f"  {c:5} {f['jobs']:5.0f} jobs  avg JCT {f['avg_jct_h']:7.2f} h  "
                  f"avg wait {f['avg_wait_h']:7.2f} h")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
