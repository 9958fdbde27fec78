"""The served scoring path against the first one, as a second computation: the
vectorised encoder (`shared.policy_features.encode`) against the per-job encoder
(`rl.reference.encode_per_job`), the numpy scorer (`network.WindowScorer`) against
the module's forward pass, and `RLPolicy`'s windows against `ReferencePolicy`'s,
over many random windows and clusters; and the policy leaves torch's settings alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from services.scoring.rl.network import NetConfig, ScoreNet, WindowScorer
from services.scoring.rl.policy import RLPolicy
from services.scoring.rl.reference import ReferencePolicy, encode_per_job
from shared.cluster import parse_cluster
from shared.placement_api import Allocation
from shared.policy_api import History, PolicyContext, QueuedJob
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES, encode, encode_global
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.state import ClusterState

CLUSTER = parse_cluster(
    {"reference": "P100",
     "nodes": [{"name": "p", "count": 3, "gpu_type": "P100", "gpus": 4},
               {"name": "k", "count": 2, "gpu_type": "K80", "gpus": 2},
               {"name": "v", "count": 1, "gpu_type": "V100", "gpus": 8}]}
)  # fmt: skip
TYPES = [frozenset(), frozenset({"P100"}), frozenset({"K80", "V100"}), frozenset({"A100"})]
VCS = ["a", "b", "c", "d"]


class _Pressured(SimObservation):
    """The simulator's observation with a set offload pressure per job."""

    pressures: dict[str, float]  # set on each instance

    def offload_pressure(self, job: QueuedJob) -> float:
        return self.pressures.get(job.job_id, 0.0)


def _world(
    rng: np.random.Generator, n: int, clones: int = 0
) -> tuple[list[QueuedJob], SimObservation]:
    """`n` waiting jobs (shares, users or only VCs, allowed types including one the
    cluster lacks, some submitted after now) on a partly used cluster, with a history
    that may be empty or hold some groups and not others; then `clones` copies of
    random ones among them (the same but for `seq`)."""
    history = History()
    for _ in range(int(rng.choice([0, 3, 40]))):
        who = str(rng.choice(VCS[:3]))
        user = str(rng.choice(["", "u1"]))
        history.record(
            QueuedJob(-1, "h", 0.0, int(rng.choice([1, 2, 4])), user=user, vc=who),
            float(rng.choice([0.0, rng.lognormal(6, 2)])),
        )
    jobs = []
    for i in range(n):
        gpus = int(rng.choice([1, 1, 2, 3, 4, 8, 16]))
        jobs.append(QueuedJob(
            i, f"j{i}", float(rng.integers(0, 1200)), gpus,
            gpu_milli=int(rng.choice([1000, 500, 250])) if gpus == 1 else 1000,
            gpu_types=TYPES[int(rng.integers(len(TYPES)))],
            user=str(rng.choice(["", "", "u1", "u2"])), vc=str(rng.choice(VCS)),
            attained_gpu_s=float(rng.choice([0.0, rng.uniform(0, 1e5)])),
        ))  # fmt: skip
    for i in range(clones):
        jobs.append(dataclasses.replace(jobs[int(rng.integers(n))], seq=n + i))
    state = ClusterState(CLUSTER)
    for node, used in (("p-0", (0, 1)), ("v-0", (0, 1, 2, 3, 4)), ("k-1", (0,))):
        if rng.random() < 0.6:
            assert state.claim(Allocation("r" + node, ((node, used),)), len(used)) is not None
    waiting = WaitingIndex()
    for j in jobs:
        waiting.add(j)
    held = {v: float(rng.choice([0.0, 2.0, 8.0])) for v in VCS if rng.random() < 0.7}
    obs = _Pressured(state, waiting, history, held)
    obs.pressures = {j.job_id: float(rng.uniform(0, 1)) for j in jobs if rng.random() < 0.3}
    obs.now = 1000.0
    return jobs, obs


def test_vectorised_encoder_equals_the_per_job_encoder() -> None:
    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.choice([0, 1, 2, 7, 40, 128]))
        jobs, obs = _world(rng, n)
        max_jobs = int(rng.choice([n, n + 5, max(n - 3, 0)]))  # exact, padded, truncated
        x, mask = encode(jobs, obs, max_jobs)
        xr, mr = encode_per_job(jobs, obs, max_jobs)
        np.testing.assert_array_equal(mask, mr)
        np.testing.assert_allclose(x, xr, rtol=1e-6, atol=1e-7, err_msg=f"trial {trial}")
        assert not x[~mask].any()


def test_encoder_rows_follow_their_jobs() -> None:
    """Permuting the window permutes the rows: no feature depends on the order."""
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(1, 60))
        jobs, obs = _world(rng, n)
        x, _ = encode(jobs, obs, n)
        perm = rng.permutation(n)
        xp, _ = encode([jobs[i] for i in perm], obs, n)
        np.testing.assert_array_equal(xp, x[perm])


def _net(context: bool, seed: int, hidden: int = 16) -> ScoreNet:
    torch.manual_seed(seed)
    net = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES), hidden, context))
    rng = np.random.default_rng(seed)
    with torch.no_grad():  # every part non-trivial: linear term, normalisers, clipping
        net.linear.weight.normal_()
        net.job_norm.update(rng.normal(2.0, 3.0, size=(50, len(JOB_FEATURES))))
        net.global_norm.update(rng.normal(0.5, 0.2, size=(20, len(GLOBAL_FEATURES))))
    return net.eval()


def _module_scores(net: ScoreNet, x: np.ndarray, g: np.ndarray, pad: int) -> np.ndarray:
    """The module's scores of `x`, with `pad` empty (masked) slots after the jobs."""
    n = len(x)
    xs = np.concatenate([x, np.random.default_rng(pad).normal(size=(pad, x.shape[1]))])
    mask = torch.zeros(1, n + pad, dtype=torch.bool)
    mask[0, :n] = True
    with torch.no_grad():
        s, _ = net(torch.as_tensor(xs[None], dtype=torch.float32), mask,
                   torch.as_tensor(g[None], dtype=torch.float32))  # fmt: skip
    assert torch.isneginf(s[0, n:]).all()
    out: np.ndarray = s[0, :n].numpy()
    return out


@pytest.mark.parametrize("context", [True, False])
def test_window_scorer_equals_the_module(context: bool) -> None:
    rng = np.random.default_rng(2)
    for trial in range(60):
        net = _net(context, trial, hidden=int(rng.choice([8, 32])))
        scorer = WindowScorer(net)
        n = int(rng.integers(1, 129))
        x = rng.normal(2.0, 4.0, size=(n, len(JOB_FEATURES))).astype(np.float32)
        x[: n // 4] *= 30.0  # beyond the normaliser's clip
        g = rng.normal(size=len(GLOBAL_FEATURES)).astype(np.float32)
        s = scorer(x, g)
        np.testing.assert_allclose(s, _module_scores(net, x, g, int(rng.integers(0, 9))),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
        perm = rng.permutation(n)
        np.testing.assert_allclose(scorer(x[perm], g), s[perm], rtol=1e-5, atol=1e-5)


def test_window_scorer_follows_changes_to_the_module() -> None:
    """An optimiser step, a normaliser update and load_state_dict each change the
    module's weights in place; the next scores are the changed module's."""
    net = _net(True, 0)
    scorer = WindowScorer(net)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(20, len(JOB_FEATURES))).astype(np.float32)
    g = rng.normal(size=len(GLOBAL_FEATURES)).astype(np.float32)
    before = scorer(x, g)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    s, v = net(torch.as_tensor(x[None]), torch.ones(1, 20, dtype=torch.bool),
               torch.as_tensor(g[None]))  # fmt: skip
    (s.sum() + v.sum()).backward()
    opt.step()
    after = scorer(x, g)
    assert not np.allclose(after, before)
    np.testing.assert_allclose(after, _module_scores(net, x, g, 0), rtol=1e-5, atol=1e-5)
    net.job_norm.update(rng.normal(5.0, 1.0, size=(30, len(JOB_FEATURES))))
    np.testing.assert_allclose(scorer(x, g), _module_scores(net, x, g, 0), rtol=1e-5, atol=1e-5)
    net.load_state_dict(_net(True, 7).state_dict())
    np.testing.assert_allclose(scorer(x, g), _module_scores(net, x, g, 0), rtol=1e-5, atol=1e-5)


def test_policy_windows_equal_the_reference_policy() -> None:
    """Whole windows, ranked by the served path and by the first one, are the same jobs
    in the same order (the cut at the wait bound included)."""
    rng = np.random.default_rng(4)
    for trial in range(40):
        net = _net(bool(trial % 2), trial, hidden=32)
        n = int(rng.integers(1, 129))
        jobs, obs = _world(rng, n)
        bound = dict(max_wait_s=600.0, bound_gpus=8) if trial % 3 == 0 else {}
        orders, k = [], int(rng.integers(1, n + 2))
        for cls in (RLPolicy, ReferencePolicy):
            policy = cls(net, JOB_FEATURES, **bound)  # type: ignore[arg-type]
            policy.reset(PolicyContext(CLUSTER, obs.history))
            for j in jobs:
                policy.add(j)
            orders.append([j.seq for j in policy.window(k, obs)])
        assert orders[0] == orders[1]
        pool = RLPolicy(net, JOB_FEATURES).candidates() or jobs
        x, _ = encode(pool, obs, len(pool))
        assert np.isfinite(WindowScorer(net)(x, encode_global(obs))).all()


def test_constructing_and_serving_leave_torch_threads_alone() -> None:
    before = torch.get_num_threads()
    other = 3 if before != 3 else 2
    torch.set_num_threads(other)
    try:
        jobs, obs = _world(np.random.default_rng(5), 30)
        policy = RLPolicy(_net(True, 0), JOB_FEATURES)
        assert torch.get_num_threads() == other
        policy.reset(PolicyContext(CLUSTER, obs.history))
        for j in jobs:
            policy.add(j)
        assert len(list(policy.window(30, obs))) == 30
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)


def test_jobs_the_network_cannot_tell_apart_go_oldest_first() -> None:
    """Clones (the same kind, submitted in the same second) have equal features, so they
    tie and the older goes first, wherever they sit in the window: equal rows in one
    matrix product may differ in the last bit, and the tie rule must not depend on it."""
    rng = np.random.default_rng(6)
    for trial in range(100):
        net = _net(bool(trial % 2), trial, hidden=32)
        jobs, obs = _world(rng, int(rng.integers(2, 100)), clones=int(rng.integers(1, 40)))
        if trial % 2:  # all submitted in one second: the clones sit far from their originals
            jobs = [dataclasses.replace(j, submit_s=500.0) for j in jobs]
        policy = RLPolicy(net, JOB_FEATURES)
        policy.reset(PolicyContext(CLUSTER, obs.history))
        for j in jobs:
            policy.add(j)
        by_job: dict[str, list[int]] = {}
        for j in policy.window(len(jobs), obs):
            by_job.setdefault(j.job_id, []).append(j.seq)
        assert all(seqs == sorted(seqs) for seqs in by_job.values())
        assert any(len(seqs) > 1 for seqs in by_job.values())
