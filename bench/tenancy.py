"""Team queues on a Philly week: per-queue figures, limits and the guarantee bound,
all recomputed from the per-job CSVs (docs/results/tenancy.md).

    .venv/bin/python -m bench.tenancy --out out/tenancy

Runs `rltune simulate` for each policy with reclaim on and off (`--no-reclaim`),
then reads only the `--jobs-out` files and the cluster file:
* per queue: jobs, avg JCT, avg queueing delay (first start - submit), share of
  the GPU-hours, preemptions (segments after the first), GPU-hours lost;
* Jain's index over the queues' mean bounded slowdowns;
* the peak GPUs of every team and org against its limit;
* every job that fitted inside its team's unused guarantee all along from its
  submission to submission + grace + minimum run + RECHECK_S, and how many of
  them started later than that (the bound), with the longest such wait.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from shared.cluster import ClusterSpec, load_cluster
from shared.sim.reclaim import RECHECK_S

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "philly"
CLUSTER = Path(__file__).resolve().parents[1] / "clusters" / "philly-tenants.yaml"


@dataclass
class Job:
    job_id: str
    queue: str
    submit: float
    gpus: int
    segs: list[tuple[float, float, float]] = field(default_factory=list)  # start, end, lost


def read_jobs(path: Path, cluster: ClusterSpec) -> dict[str, Job]:
    jobs: dict[str, Job] = {}
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            j = jobs.get(r["job_id"])
            if j is None:
                q = cluster.queue_of(r["vc"])
                j = jobs[r["job_id"]] = Job(
                    r["job_id"], q, float(r["submit_s"]), int(r["num_gpus"])
                )
            if r["start_s"]:
                lost = float(r.get("lost_s") or 0.0)
                j.segs.append((float(r["start_s"]), float(r["finish_s"]), lost))
    return jobs


def _peak(spans: list[tuple[float, float, int]]) -> float:
    ev = sorted([(s, g) for s, _, g in spans] + [(f, -g) for _, f, g in spans])
    cur = top = 0.0
    for _, d in sorted(ev, key=lambda e: (e[0], e[1])):  # releases first at one instant
        cur += d
        top = max(top, cur)
    return top


def analyse(jobs: dict[str, Job], cluster: ClusterSpec, bound_s: float) -> dict[str, object]:
    parent = {n: q.parent for n, q in cluster.queues.items()}
    total_gpu_h = sum(j.gpus * (f - s) for j in jobs.values() for s, f, _ in j.segs) / 3600
    per: dict[str, dict[str, float]] = {}
    by_q: dict[str, list[Job]] = defaultdict(list)
    for j in jobs.values():
        by_q[j.queue].append(j)
    for q, js in sorted(by_q.items()):
        done = [j for j in js if j.segs]
        gpu_h = sum(j.gpus * (f - s) for j in done for s, f, _ in j.segs) / 3600
        bsld = [
            max(1.0, (j.segs[-1][1] - j.submit) / max(sum(f - s for s, f, _ in j.segs), 10.0))
            for j in done
        ]
        per[q] = {
            "jobs": len(done),
            "avg_jct_h": sum(j.segs[-1][1] - j.submit for j in done) / len(done) / 3600,
            "avg_queue_h": sum(j.segs[0][0] - j.submit for j in done) / len(done) / 3600,
            "gpu_share": gpu_h / total_gpu_h,
            "avg_bsld": sum(bsld) / len(bsld),
            "preemptions": sum(len(j.segs) - 1 for j in done),
            "lost_gpu_h": sum(j.gpus * lost for j in done for _, _, lost in j.segs) / 3600,
        }
    xs = [v["avg_bsld"] for v in per.values()]
    jain = sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
    # spans per team and org, from the rows
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    owner: dict[str, list[tuple[str, float, float, int]]] = defaultdict(list)
    for j in jobs.values():
        for s, f, _ in j.segs:
            for name in (j.queue, parent.get(j.queue)):
                if name:
                    spans[name].append((s, f, j.gpus))
            owner[j.queue].append((j.job_id, s, f, j.gpus))
    over = {
        n: (_peak(spans[n]), q.limit_gpus)
        for n, q in cluster.queues.items()
        if q.limit_gpus is not None and _peak(spans[n]) > q.limit_gpus + 1e-9
    }
    # the guarantee bound
    eligible = late = 0
    worst = 0.0
    for j in jobs.values():
        g = cluster.queues[j.queue].guaranteed_gpus if j.queue in cluster.queues else 0.0
        if not j.segs or j.gpus > g:
            continue
        others = [x for x in owner[j.queue] if x[0] != j.job_id]
        t0, t1 = j.submit, j.submit + bound_s
        moments = [t0] + [s for _, s, _, _ in others if t0 < s <= t1]
        if all(sum(x[3] for x in others if x[1] <= m < x[2]) + j.gpus <= g for m in moments):
            eligible += 1
            wait = j.segs[0][0] - t0
            worst = max(worst, wait)
            late += wait > bound_s + 1e-6
    return {
        "queues": per,
        "jain_bsld": jain,
        "over_limit": over,
        "fit_guarantee_jobs": eligible,
        "fit_guarantee_late": late,
        "fit_guarantee_max_wait_h": worst / 3600,
        "preemptions": sum(v["preemptions"] for v in per.values()),
        "lost_gpu_h": sum(v["lost_gpu_h"] for v in per.values()),
        "avg_jct_h": sum(j.segs[-1][1] - j.submit for j in jobs.values() if j.segs)
        / sum(1 for j in jobs.values() if j.segs)
        / 3600,
        "avg_queue_h": sum(j.segs[0][0] - j.submit for j in jobs.values() if j.segs)
        / sum(1 for j in jobs.values() if j.segs)
        / 3600,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/tenancy")
    ap.add_argument("--policies", default="fifo,drf")
    ap.add_argument("--since", default="2017-10-01")
    ap.add_argument("--until", default="2017-10-08")
    ap.add_argument("--placer", default="greedy")
    ap.add_argument("--load", default=None, help="passed to simulate: compress to this load")
    ap.add_argument("--plot", default=None, help="write the per-queue plot here (PNG)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(CLUSTER)
    rltune = str(Path(sys.executable).parent / "rltune")
    bound = 120.0 + 600.0 + RECHECK_S
    results: dict[str, dict[str, object]] = {}
    for pol in args.policies.split(","):
        for mode in ("reclaim", "no-reclaim"):
            name = f"{pol}-{mode}"
            csv_path = out / f"jobs-{name}.csv"
            cmd = [
                rltune, "simulate", "--trace", str(TRACE / "philly-sep-oct.csv"),
                "--format", "philly", "--cluster", str(CLUSTER), "--since", args.since,
                "--until", args.until, "--placer", args.placer, "--policy", pol,
                "--json", str(out / f"summary-{name}.json"), "--jobs-out", str(csv_path),
            ] + (["--no-reclaim"] if mode == "no-reclaim" else [])  # fmt: skip
            cmd += ["--load", args.load] if args.load else []
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            results[name] = analyse(read_jobs(csv_path, cluster), cluster, bound)
            r = results[name]
            print(
                f"{name}: avg JCT {r['avg_jct_h']:.2f} h, avg queue {r['avg_queue_h']:.2f} h, "
                f"Jain {r['jain_bsld']:.3f}, preemptions {r['preemptions']}, lost "
                f"{r['lost_gpu_h']:.1f} GPU-h, over limit {r['over_limit'] or 'none'}, "
                f"fit-guarantee jobs {r['fit_guarantee_jobs']} late {r['fit_guarantee_late']} "
                f"(max wait {r['fit_guarantee_max_wait_h']:.2f} h)"
            )
    (out / "tenancy.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    print(_table(results))
    if args.plot:
        _plot(results, Path(args.plot))
    return 0


def _table(results: dict[str, dict[str, object]]) -> str:
    names = list(results)
    queues = sorted(next(iter(results.values()))["queues"])  # type: ignore[call-overload]
    head = "| queue | " + " | ".join(f"{n} JCT h / queue h / share" for n in names) + " |"
    lines = [head, "|---" * (len(names) + 1) + "|"]
    for q in queues:
        cells = []
        for n in names:
            v = results[n]["queues"][q]  # type: ignore[index]
            cells.append(f"{v['avg_jct_h']:.1f} / {v['avg_queue_h']:.1f} / {v['gpu_share']:.3f}")
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(results: dict[str, dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    queues = sorted(next(iter(results.values()))["queues"])  # type: ignore[call-overload]
    fig, ax = plt.subplots(figsize=(10, 4))
    w = 0.8 / len(names)
    for k, n in enumerate(names):
        vals = [results[n]["queues"][q]["avg_queue_h"] for q in queues]  # type: ignore[index]
        ax.bar([i + k * w for i in range(len(queues))], vals, w, label=n)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(queues))], queues, rotation=45)
    ax.set_ylabel("avg queueing delay (h)")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.legend(fontsize=8)
    ax.set_title("Philly 2017-10-01..08, clusters/philly-tenants.yaml: queueing delay per queue")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
