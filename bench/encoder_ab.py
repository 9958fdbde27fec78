"""`rltune bench encoder_ab`: the served scoring path with the feature encoder of
another git revision ("before") against this checkout's ("after"), on the window
`rltune bench train` times, interleaved call by call in one process pinned to one
core: CPU time of one window (thread time), p50 and p99, and the largest
difference between the two encoders' features (0: the same numbers).

    rltune bench encoder_ab --before REV [--model models/rl-mixed.pt] [--repeat 3000]

The revision's `shared/policy_features.py` is read with `git show` and imported as a
module of its own; it uses this checkout's `History` (its methods must still be
there). Columns the older encoder did not have are left out of the comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np

from bench.train import ROOT, TARGET_P99_MS, bench_window
from services.scoring.rl import load_checkpoint
from services.scoring.rl.policy import RLPolicy
from shared.errors import UserError
from shared.metrics import percentile
from shared.policy_api import Observation, PolicyContext, QueuedJob


def _module_at(rev: str, tmp: Path) -> ModuleType:
    try:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:shared/policy_features.py"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    except subprocess.CalledProcessError as e:
        raise UserError(f"--before {rev}: {e.stderr.strip().splitlines()[-1]}") from None
    path = tmp / "policy_features_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("policy_features_before", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rltune bench encoder_ab", description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="git revision of the encoder to compare")
    p.add_argument("--model", default=str(ROOT / "models" / "rl-mixed.pt"))
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3000)
    a = p.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    ckpt = load_checkpoint(a.model)
    with tempfile.TemporaryDirectory() as tmp:
        old = _module_at(a.before, Path(tmp))
    missing = [f for f in ckpt.features if f not in old.JOB_FEATURES]
    if missing:
        raise UserError(
            f"{a.model} reads {', '.join(missing)}, which the encoder at {a.before} lacks"
        )

    params = inspect.signature(old.encode).parameters
    takes_origin, takes_unicep = "origin_s" in params, "unicep" in params
    if ckpt.net.cfg.base == "f1-unicep" and not takes_unicep:
        raise UserError(f"{a.model} is a residual on f1-unicep, which the encoder at "
                        f"{a.before} cannot encode")  # fmt: skip

    class Before(RLPolicy):
        def encode(self, pool: list[QueuedJob], obs: Observation) -> np.ndarray:
            kw: dict[str, object] = {"identity": self.reads_identity}
            if takes_origin and self._f1 is not None:  # a residual on f1 (RLPolicy.encode)
                kw["origin_s"] = self.origin_s
            if takes_unicep:
                kw["unicep"] = self.unicep_keys()
            x: np.ndarray = old.encode(pool, obs, len(pool), **kw)[0]
            return x

    cluster, history, jobs, obs = bench_window(a.window, ckpt.features)
    policies = {
        "before": Before(ckpt.net, ckpt.features),
        "after": RLPolicy(ckpt.net, ckpt.features),
    }
    for pol in policies.values():
        pol.reset(PolicyContext(cluster, history))
        for j in jobs:
            pol.add(j)
    pool = policies["after"].candidates(obs)
    xb, xa = (pol.encode(pool, obs) for pol in policies.values())
    diff = float(np.abs(xa[:, : xb.shape[1]] - xb).max())
    orders = [[j.seq for j in pol.window(a.window, obs)] for pol in policies.values()]
    assert orders[0] == orders[1], "the two encoders rank the window differently"
    cpu: dict[str, list[float]] = {name: [] for name in policies}
    for _ in range(a.repeat):
        for name, pol in policies.items():
            c0 = time.thread_time()
            got = list(pol.window(a.window, obs))
            cpu[name].append((time.thread_time() - c0) * 1e3)
            assert len(got) == a.window
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{Path(a.model).name}: one {a.window}-job window, {a.repeat} times each, interleaved, "
        f"one core (load average {load:.1f}); largest feature difference {diff:.3g}"
    )
    for name, xs in cpu.items():
        rev = a.before if name == "before" else "this checkout"
        print(
            f"  {name:6} ({rev}): CPU p50 {statistics.median(xs):.3f} ms, "
            f"p99 {percentile(xs, 99):.3f} ms (target p99 <= {TARGET_P99_MS} ms)"
        )
    sys.stdout.flush()
    return 0
