"""The learned policy as a `Policy`: what it may see, its order, its checkpoints."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from services.scoring.rl import Checkpoint, RLPolicy, load_checkpoint, save_checkpoint
from services.scoring.rl.network import NetConfig, ScoreNet, WindowScorer
from services.scoring.rl.policy import Recorder, Step
from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.policy_api import History, OracleContext, PolicyContext, QueuedJob
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES
from shared.sim import SimConfig, simulate
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.state import ClusterState
from tests.shared.canary_trace import canary_trace

CLUSTER = parse_cluster(
    {"reference": "P100",
     "nodes": [{"name": "p", "count": 1, "gpu_type": "P100", "gpus": 4},
               {"name": "k", "count": 1, "gpu_type": "K80", "gpus": 2}]}
)  # fmt: skip


def _net(seed: int = 0) -> ScoreNet:
    torch.manual_seed(seed)
    net = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES), hidden=16))
    with torch.no_grad():
        net.linear.weight.normal_()
    return net


def _jobs(rng: np.random.Generator, n: int) -> list[QueuedJob]:
    return [
        QueuedJob(i, f"j{i}", float(rng.integers(0, 500)), int(rng.choice([1, 1, 2, 4])),
                  vc=str(rng.choice(["a", "b", "c"])), attained_gpu_s=float(rng.integers(0, 9)))
        for i in range(n)
    ]  # fmt: skip


def _obs(history: History, jobs: list[QueuedJob]) -> SimObservation:
    waiting = WaitingIndex()
    for j in jobs:
        waiting.add(j)
    obs = SimObservation(ClusterState(CLUSTER), waiting, history, {})
    obs.now = 1000.0
    return obs


def test_window_does_not_depend_on_the_order_jobs_were_added() -> None:
    rng = np.random.default_rng(0)
    history = History()
    history.record(QueuedJob(99, "h", 0.0, 1, vc="a"), 50.0)
    history.record(QueuedJob(98, "h", 0.0, 2, vc="b"), 5000.0)
    for trial in range(20):
        jobs = _jobs(rng, int(rng.integers(2, 30)))
        obs = _obs(history, jobs)
        orders = []
        for shuffle in range(3):
            policy = RLPolicy(_net(trial), JOB_FEATURES)
            policy.reset(PolicyContext(CLUSTER, history))
            for i in np.random.default_rng(shuffle).permutation(len(jobs)):
                policy.add(jobs[i])
            orders.append([j.seq for j in policy.window(128, obs)])
        assert orders[0] == orders[1] == orders[2]
        assert sorted(orders[0]) == list(range(len(jobs)))


def test_a_long_queue_shows_every_group() -> None:
    """With more jobs waiting than the network scores, each group's oldest is among them."""
    policy = RLPolicy(_net(), JOB_FEATURES, max_jobs=8)
    policy.reset(PolicyContext(CLUSTER, History()))
    for i in range(20):  # 20 jobs of group (a, 1 GPU), then one of (b, 2 GPUs)
        policy.add(QueuedJob(i, f"j{i}", float(i), 1, vc="a"))
    policy.add(QueuedJob(20, "late", 20.0, 2, vc="b"))
    pool = [j.seq for j in policy.candidates()]
    assert len(pool) == 8 and 20 in pool and pool[:7] == list(range(7))


# ---- it never sees a job's true run time ------------------------------------------------


class _Log:
    def __init__(self) -> None:
        self.rounds: list[tuple[float, list[int], np.ndarray]] = []

    def record(self, step: Step, now: float) -> None:
        self.rounds.append((now, step.pool, step.x.copy()))

    def removed(self, seq: int) -> None:
        pass


class _Leaky(RLPolicy):
    """A deliberately broken policy: it declares itself an oracle, so it is handed the
    true run times, and adds them to one feature."""

    oracle = True

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        assert isinstance(ctx, OracleContext)
        self._true = ctx.true_run_s

    def window(self, k, obs):  # type: ignore[no-untyped-def]
        assert self.recorder is not None
        rec: Recorder = self.recorder

        class Spy:
            def record(inner, step: Step, now: float) -> None:
                for row, seq in enumerate(step.pool):
                    step.x[row, 0] += self._true(self._fifo[seq])
                rec.record(step, now)

            def removed(inner, seq: int) -> None:
                rec.removed(seq)

        self.recorder = Spy()
        try:
            return list(super().window(k, obs))
        finally:
            self.recorder = rec


def _rounds(policy_cls: type[RLPolicy], scale: np.ndarray | None) -> list:
    policy = policy_cls(_net(3), JOB_FEATURES)
    log = _Log()
    policy.recorder = log
    simulate(canary_trace(scale), CLUSTER, policy, make_placer("greedy"), SimConfig(window=128))
    return [r for r in log.rounds if r[0] < 10_200.0]


@pytest.mark.parametrize("policy_cls, leaks", [(RLPolicy, False), (_Leaky, True)])
def test_features_never_carry_the_true_run_time(policy_cls: type[RLPolicy], leaks: bool) -> None:
    """Rescale the run times of jobs that have not finished: everything the policy saw
    before the first of them finishes must be bit-identical. The leaky canary shows
    the check would catch a policy that reads them."""
    a = _rounds(policy_cls, None)
    b = _rounds(policy_cls, np.random.default_rng(2).uniform(1.0, 5.0, size=30))
    assert len(a) == len(b) >= 5
    assert any(len(pool) >= 5 for _, pool, _ in a)  # jobs really queued
    same = all(
        ta == tb and pa == pb and np.array_equal(xa, xb)
        for (ta, pa, xa), (tb, pb, xb) in zip(a, b, strict=True)
    )
    assert same is not leaks


def test_policy_keeps_nothing_of_the_oracle() -> None:
    policy = RLPolicy(_net(), JOB_FEATURES)
    policy.reset(OracleContext(CLUSTER, History(), 0, true_run_s=lambda j: 123.0))
    assert not policy.oracle
    ours = (torch.nn.Module, WindowScorer)  # the network, and its numpy copy
    seen = [v for v in vars(policy).values() if callable(v) and not isinstance(v, ours)]
    assert seen == []
    names = [f.name for f in dataclasses.fields(QueuedJob)]
    assert not any("duration" in n or n.endswith("run_s") or n == "work" for n in names)


# ---- checkpoints ----------------------------------------------------------------------------


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    net = _net(5)
    net.job_norm.update(np.random.default_rng(0).normal(size=(9, len(JOB_FEATURES))))
    path = tmp_path / "m.pt"
    save_checkpoint(path, Checkpoint(net, JOB_FEATURES, {"trace": "x.csv", "clusters": {"c": "y"}}))
    back = load_checkpoint(path)
    assert back.features == JOB_FEATURES and back.meta["trace"] == "x.csv"
    x = torch.as_tensor(np.random.default_rng(1).normal(size=(2, 7, len(JOB_FEATURES))),
                        dtype=torch.float32)  # fmt: skip
    mask, g = torch.ones(2, 7, dtype=torch.bool), torch.ones(2, len(GLOBAL_FEATURES))
    with torch.no_grad():
        torch.testing.assert_close(back.net(x, mask, g), net(x, mask, g))
    policy = make_policy(f"rl:{path}")
    assert policy.label == "rl:m" and not policy.oracle


def _tamper(src: Path, dst: Path, **changes: object) -> None:
    data = torch.load(src, weights_only=True)
    data.update(changes)
    torch.save(data, dst)


def test_mismatched_checkpoint_is_refused_with_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    save_checkpoint(good, Checkpoint(_net(), JOB_FEATURES))
    bad = tmp_path / "bad.pt"
    _tamper(good, bad, features=[*JOB_FEATURES[:-1], "true_run_s"])
    with pytest.raises(UserError, match=r"features do not match.*true_run_s"):
        load_checkpoint(bad)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match=r"not a readable rltune checkpoint \(not a torch.save"):
        load_checkpoint(junk)
    cut = tmp_path / "cut.pt"  # a checkpoint cut short (a copy that stopped halfway)
    cut.write_bytes(good.read_bytes()[:3000])
    with pytest.raises(UserError, match="not a readable rltune checkpoint") as err:
        load_checkpoint(cut)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"job_id": "a", "num_gpus": 1, "submit_time": 0, "duration_s": 5}\n')
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {name: n, gpu_type: P100, gpus: 1}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rltune", "simulate", "--trace", str(trace), "--format",
         "jsonl", "--cluster", str(cluster), "--policy", f"rl:{bad}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "features do not match" in lines[0] and "true_run_s" in lines[0]


# ---- the wait bound (aging) --------------------------------------------------------------


def test_jobs_past_the_wait_bound_go_first_oldest_first_and_only_the_rest_is_recorded() -> None:
    """Over random queues: every job of `bound_gpus` or more that has waited
    `max_wait_s` or more heads the window in submit order; behind them comes the
    unbounded policy's ranking of the others; a recorded round holds only the jobs
    the network ranked, and counts only the ranks read among them."""
    rng = np.random.default_rng(3)
    history = History()
    history.record(QueuedJob(99, "h", 0.0, 1, vc="a"), 50.0)
    for trial in range(30):
        jobs = _jobs(rng, int(rng.integers(2, 30)))
        obs = _obs(history, jobs)  # now = 1000, submits in [0, 500): waits in (500, 1000]
        bound = float(rng.uniform(500.0, 1000.0))
        big = int(rng.choice([1, 2, 4]))
        late = {j.seq for j in jobs if obs.now - j.submit_s >= bound and j.num_gpus >= big}
        old = sorted((j for j in jobs if j.seq in late), key=lambda j: (j.submit_s, j.seq))
        young = [j for j in jobs if j.seq not in late]
        bounded = RLPolicy(_net(trial), JOB_FEATURES, max_wait_s=bound, bound_gpus=big)
        free = RLPolicy(_net(trial), JOB_FEATURES)
        for p, js in ((bounded, jobs), (free, young)):
            p.reset(PolicyContext(CLUSTER, history))
            for j in js:
                p.add(j)
        steps: list[Step] = []
        bounded.recorder = _Steps(steps)
        k = int(rng.integers(1, len(jobs) + 1))
        got = [j.seq for j in bounded.window(k, obs)]
        want = [j.seq for j in old] + [j.seq for j in free.window(len(young), obs)]
        assert got == want[:k]
        if young:
            assert len(steps) == 1 and sorted(steps[0].pool) == sorted(j.seq for j in young)
            assert steps[0].pulled == max(k - len(old), 0)
        else:
            assert steps == []


class _Steps:
    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps

    def record(self, step: Step, now: float) -> None:
        self.steps.append(step)

    def removed(self, seq: int) -> None:
        pass


def test_the_wait_bound_travels_in_the_checkpoint(tmp_path: Path) -> None:
    from services.scoring.rl import load_policy

    for meta, want in (
        ({}, (None, 1, "fixed")),
        ({"max_wait_s": 7200.0, "bound_gpus": 16}, (7200.0, 16, "fixed")),
        (
            {"max_wait_s": 7200.0, "bound_gpus": 16, "bound_scale": "backlog"},
            (7200.0, 16, "backlog"),
        ),
        ({"max_wait_s": None, "bound_gpus": 16, "bound_scale": "fifo"}, (None, 16, "fifo")),
    ):
        path = tmp_path / "m.pt"
        save_checkpoint(path, Checkpoint(_net(), JOB_FEATURES, meta))
        policy = load_policy(str(path))
        assert (policy.max_wait_s, policy.bound_gpus, policy.bound_scale) == want


def test_the_backlog_bound_scales_with_the_waiting_gpus() -> None:
    """Hand-computed: 6 GPUs, 7 waiting (4 + 2 + 1), so a 300 s bound becomes
    300 x (1 + 7/6) = 650 s. The 4-GPU job (waited 1000 s) goes ahead under both
    scales; the 2-GPU job (waited 600 s) only under the fixed one, so the network
    ranks it (it is in the recorded round) under the backlog one."""
    history = History()
    jobs = [QueuedJob(0, "a", 0.0, 4, vc="a"), QueuedJob(1, "b", 400.0, 2, vc="b"),
            QueuedJob(2, "c", 900.0, 1, vc="c")]  # fmt: skip
    obs = _obs(history, jobs)  # now = 1000
    ranked = {}
    for scale in ("fixed", "backlog"):
        p = RLPolicy(_net(), JOB_FEATURES, max_wait_s=300.0, bound_gpus=2, bound_scale=scale)
        p.reset(PolicyContext(CLUSTER, history))
        for j in jobs:
            p.add(j)
        steps: list[Step] = []
        p.recorder = _Steps(steps)
        head = [j.seq for j in p.window(3, obs)]
        ranked[scale] = (p.bound_s(obs), head, sorted(steps[0].pool))
    assert ranked["fixed"][0] == 300.0 and ranked["backlog"][0] == pytest.approx(650.0)
    assert ranked["fixed"][1][:2] == [0, 1] and ranked["fixed"][2] == [2]
    assert ranked["backlog"][1][0] == 0 and ranked["backlog"][2] == [1, 2]
    with pytest.raises(UserError, match="bound scale 'load'"):
        RLPolicy(_net(), JOB_FEATURES, max_wait_s=300.0, bound_scale="load")
