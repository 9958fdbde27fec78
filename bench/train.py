"""`rltune bench train`: what training and serving the learned policy cost, in one run.

* rollouts: the same episodes (Philly before 2017-10-15, the training clusters)
  run in this process and on `--workers` processes: policy decisions/s and
  simulated jobs/s (both runs of an episode, the baseline's and the policy's,
  count), and their ratio;
* one PPO update on those episodes' rounds (seconds);
* serving: the p50/p99 of scoring one `--window`-job window on one core
  (encode + network + order, as `RLPolicy.window` does it), as wall time and
  as the thread's CPU time (what the wall time is on an idle core; the target,
  p99 <= 2 ms, is judged on it), next to the first scoring path (per-job
  encoder and PyTorch forward, `rl.reference`; the same order is checked) and
  sjf-est's window over the same queue, interleaved call by call.

    rltune bench train [--model models/rl.pt] [--episodes 8] [--workers 2] [--json -]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from services.scoring.policies import make_policy
from services.scoring.rl import SHIPPED, load_checkpoint
from services.scoring.rl.args import Args
from services.scoring.rl.env import EpisodeConfig
from services.scoring.rl.network import NetConfig, ScoreNet
from services.scoring.rl.policy import RLPolicy
from services.scoring.rl.reference import ReferencePolicy
from services.scoring.rl.rollout import Rollouts, make_batch
from services.scoring.rl.train import _train_world, episode_specs, ppo_update
from shared.cluster import ClusterSpec, load_cluster
from shared.jsonfile import write_json
from shared.metrics import percentile
from shared.policy_api import History, Policy, PolicyContext, QueuedJob
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.state import ClusterState

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "philly" / "philly-sep-oct.csv"
TRAIN_CLUSTERS = tuple(str(p) for p in sorted((ROOT / "clusters" / "train").glob("*.yaml")))
TARGET_P99_MS = 2.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rltune bench train", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(SHIPPED), help="checkpoint (default: the shipped one)")
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--repeat", type=int, default=2000, help="windows scored for the latency")
    p.add_argument("--json", default=None, metavar="OUT")
    p.add_argument(
        "--no-identity-window", action="store_true",
        help="time a window of jobs without users or requests (VCs only), as on Philly or "
             "ITP, even for a checkpoint that reads identity (a residual on f1-unicep "
             "then scores in its unicep mode)",
    )  # fmt: skip
    a = p.parse_args(argv)
    torch.set_num_threads(1)  # as in the workers: one core per simulator
    if Path(a.model).exists():
        ckpt = load_checkpoint(a.model)
        net, features = ckpt.net, ckpt.features
    else:
        print(f"{a.model} not found: an untrained network of the same shape is timed")
        torch.manual_seed(0)
        net, features = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES))), JOB_FEATURES
    out: dict[str, object] = {}
    out.update(_rollouts(a, net, features))
    out.update(_latency(a, net, features))
    if a.json:
        write_json(out, a.json)
    return 0


def _rollouts(a: argparse.Namespace, net: ScoreNet, features: tuple[str, ...]) -> dict[str, float]:
    args = Args(trace=a.trace, clusters=TRAIN_CLUSTERS, until="2017-10-15", val_from="2017-10-05")
    cfg = EpisodeConfig()
    traces, _ = _train_world(args)
    specs = episode_specs([len(t) for t in traces], cfg, a.episodes, [1, 0])
    rates: dict[int, tuple[float, float]] = {}
    results = []
    for workers in (0, a.workers):
        pool = Rollouts(functools.partial(_train_world, args), workers)
        pool.run(specs[: max(workers, 1)], cfg, net, features)  # start-up, trace reading: untimed
        t0 = time.perf_counter()
        results = pool.run(specs, cfg, net, features)
        wall = time.perf_counter() - t0
        pool.close()
        decisions = sum(r.decisions for r in results)
        jobs = sum(2 * r.jobs for r in results)
        rates[workers] = (decisions / wall, jobs / wall)
        print(
            f"rollouts, {workers or 'no'} worker process{'es' if workers != 1 else ''}: "
            f"{decisions / wall:,.0f} decisions/s, {jobs / wall:,.0f} simulated jobs/s "
            f"({a.episodes} episodes, {decisions} decisions, {jobs} jobs, {wall:.1f} s)"
        )
    ratio = rates[a.workers][1] / rates[0][1]
    print(f"ratio {a.workers} workers / in-process: {ratio:.2f}")
    batch = make_batch(results, features)
    update_s = float("nan")
    if batch is not None:
        opt = torch.optim.Adam(net.parameters(), lr=0.0)  # lr 0: the weights stay as loaded
        t0 = time.perf_counter()
        ppo_update(net, opt, batch, Args(), torch.Generator().manual_seed(0))
        update_s = time.perf_counter() - t0
        print(f"one PPO update: {update_s:.2f} s on {len(batch)} rounds (4 epochs, one thread)")
    return {
        "decisions_per_s": rates[0][0],
        "jobs_per_s": rates[0][1],
        f"decisions_per_s_{a.workers}_workers": rates[a.workers][0],
        f"jobs_per_s_{a.workers}_workers": rates[a.workers][1],
        "workers_speedup": ratio,
        "ppo_update_s": update_s,
    }


def bench_window(
    window: int, features: tuple[str, ...], identity: bool = True
) -> tuple[ClusterSpec, History, list[QueuedJob], SimObservation]:
    """The window the latency is measured on: `window` jobs waiting on Philly's
    heterogeneous cluster with 2,000 finished jobs behind them (`identity=False`: jobs
    of VCs only, whatever the checkpoint reads)."""
    cluster = load_cluster(ROOT / "clusters" / "philly-hetero.yaml")
    rng = np.random.default_rng(0)
    history = History()
    # a checkpoint that reads identity is timed on jobs that carry it (users,
    # projects, executables, requested times: its costliest features), others on VCs
    ident = identity and any(f.startswith(("log_user", "user_", "log_req")) for f in features)

    def who(i: int) -> dict[str, object]:
        if not ident:
            return {"vc": f"vc{i % 12}"}
        return {"vc": f"vc{i % 12}", "user": f"u{i % 40}", "project": f"p{i % 9}",
                "app": f"a{i % 25}", "time_limit_s": float(3600 * (1 + i % 6))}  # fmt: skip

    for i in range(2000):  # finished jobs of 12 VCs (and 40 users, 9 projects, 25 apps)
        history.record(
            QueuedJob(-1, "h", float(i), int(rng.choice([1, 2, 4, 8])), **who(i)),  # type: ignore[arg-type]
            float(rng.lognormal(8, 2)),
        )
    jobs = [
        QueuedJob(i, f"j{i}", float(i * 30), int(rng.choice([1, 1, 1, 2, 4, 8])),
                  **who(int(rng.integers(2000))))  # type: ignore[arg-type]
        for i in range(window)
    ]  # fmt: skip
    waiting = WaitingIndex()
    for j in jobs:
        waiting.add(j)
    obs = SimObservation(ClusterState(cluster), waiting, history, {})
    obs.now = window * 30.0 + 600.0
    return cluster, history, jobs, obs


def _latency(a: argparse.Namespace, net: ScoreNet, features: tuple[str, ...]) -> dict[str, float]:
    """Score one full window, many times, on one core: the served path (`RLPolicy`), the
    first one (`ReferencePolicy`: per-job encoder, PyTorch forward) and sjf-est,
    interleaved so that the machine's load falls on all three alike."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    cluster, history, jobs, obs = bench_window(a.window, features, not a.no_identity_window)
    policies: dict[str, Policy] = {
        "rl": RLPolicy(net, features),
        "rl-first": ReferencePolicy(net, features),
        "sjf-est": make_policy("sjf-est"),
    }
    for policy in policies.values():
        policy.reset(PolicyContext(cluster, history))
        for j in jobs:
            policy.add(j)
    wall: dict[str, list[float]] = {name: [] for name in policies}
    cpu: dict[str, list[float]] = {name: [] for name in policies}
    orders = {name: [j.seq for j in p.window(a.window, obs)] for name, p in policies.items()}
    assert orders["rl"] == orders["rl-first"], "the served and the first path rank differently"
    for _ in range(a.repeat):
        for name, policy in policies.items():
            c0, t0 = time.thread_time(), time.perf_counter()
            got = list(policy.window(a.window, obs))
            wall[name].append((time.perf_counter() - t0) * 1e3)
            cpu[name].append((time.thread_time() - c0) * 1e3)
            assert len(got) == a.window
    out: dict[str, float] = {"window": float(a.window)}
    for name in policies:
        key = name.replace("-", "_")
        out[f"{key}_wall_p50_ms"] = statistics.median(wall[name])
        out[f"{key}_wall_p99_ms"] = percentile(wall[name], 99)
        out[f"{key}_cpu_p50_ms"] = statistics.median(cpu[name])
        out[f"{key}_cpu_p99_ms"] = percentile(cpu[name], 99)
    out["score_p50_ms"], out["score_p99_ms"] = out["rl_wall_p50_ms"], out["rl_wall_p99_ms"]
    out["score_cpu_p50_ms"], out["score_cpu_p99_ms"] = out["rl_cpu_p50_ms"], out["rl_cpu_p99_ms"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out["load_average"] = load
    verdict = "met" if out["rl_cpu_p99_ms"] <= TARGET_P99_MS else "MISSED"
    print(
        f"scoring one {a.window}-job window on one core, {a.repeat} times each, interleaved "
        f"(load average {load:.1f}); ms, CPU time (the wall time on an idle core) and wall:"
    )
    for name, what in (
        ("rl", "served: vectorised encoder, numpy network"),
        ("rl-first", "first: per-job encoder, PyTorch module"),
        ("sjf-est", "sjf-est's window"),
    ):
        key = name.replace("-", "_")
        print(
            f"  {name:8} CPU p50 {out[f'{key}_cpu_p50_ms']:.3f} p99 {out[f'{key}_cpu_p99_ms']:.3f}"
            f" | wall p50 {out[f'{key}_wall_p50_ms']:.3f} p99 {out[f'{key}_wall_p99_ms']:.3f}"
            f"  ({what})"
        )
    ratio_p50 = out["rl_first_cpu_p50_ms"] / out["rl_cpu_p50_ms"]
    ratio_p99 = out["rl_first_cpu_p99_ms"] / out["rl_cpu_p99_ms"]
    out["speedup_cpu_p50"], out["speedup_cpu_p99"] = ratio_p50, ratio_p99
    print(
        f"  served / first: x{ratio_p50:.2f} faster at p50, x{ratio_p99:.2f} at p99 (CPU); "
        f"rl / sjf-est (CPU p50) x{out['rl_cpu_p50_ms'] / out['sjf_est_cpu_p50_ms']:.1f}; "
        f"target rl CPU p99 <= {TARGET_P99_MS} ms: {verdict}"
    )
    return out
