"""`f1-unicep` (services/scoring/policies/f1_unicep.py) and the residual network on it:
the rule's orders worked by hand (a queue without identity goes in unicep's order, the
same queue with requested times in f1's), the half-informed switch, the window equal to
the `f1` or `unicep` module's over random queues; the encoder's unicep key against the
unicep module's own score (an order computed apart from the encoder) and against the
per-job reference encoder; and an untrained residual network on it ranking every
window exactly as the module does, on queues with identity and without."""

from __future__ import annotations

import math

import numpy as np

from services.scoring.policies import make_policy
from services.scoring.policies.f1_unicep import F1Unicep
from services.scoring.rl.args import Args
from services.scoring.rl.policy import RLPolicy
from services.scoring.rl.reference import encode_per_job
from services.scoring.rl.train import feature_list
from shared.cluster import parse_cluster
from shared.policy_api import History, PolicyContext, QueuedJob
from shared.policy_features import JOB_FEATURES, encode
from shared.sim.observe import SimObservation
from tests.policy_windows import assert_same_windows, untrained_residual, window_obs

CLUSTER = parse_cluster({"nodes": [{"name": "d", "count": 4, "gpu_type": "A100", "gpus": 8}]})
ARGS = Args(residual="f1-unicep", features="identity", residual_bound=2.0)
KEY = JOB_FEATURES.index("f1_key")
REST = JOB_FEATURES.index("f1_key_rest")


def _obs(jobs: list[QueuedJob], history: History, now: float) -> SimObservation:
    return window_obs(CLUSTER, jobs, history, now)


def _hand_queue(limits: bool) -> tuple[list[QueuedJob], History]:
    """VC `a` has run 1-GPU jobs of 100 s and 4-GPU jobs of 1,000 s (mean of all its
    runs: 550 s). j0: 4 GPUs at t=0, j1: 1 GPU at 50, j2: 2 GPUs at 90; with `limits`
    each asks for its VC mean (1,000, 100, 550 s)."""
    h = History()
    h.record(QueuedJob(100, "h1", 0.0, 1, vc="a"), 100.0)
    h.record(QueuedJob(101, "h4", 0.0, 4, vc="a"), 1000.0)
    asks = (1000.0, 100.0, 550.0) if limits else (None, None, None)
    jobs = [
        QueuedJob(i, f"j{i}", t, n, vc="a", time_limit_s=r)
        for i, (t, n, r) in enumerate(zip((0.0, 50.0, 90.0), (4, 1, 2), asks, strict=True))
    ]
    return jobs, h


def _window(
    policy: F1Unicep, jobs: list[QueuedJob], h: History, now: float, k: int = 10
) -> list[int]:
    policy.reset(PolicyContext(CLUSTER, h))
    for j in jobs:
        policy.add(j)
    return [j.seq for j in policy.window(k, _obs(jobs, h, now))]


def test_orders_by_hand() -> None:
    # at t=100 without identity, unicep: j1 (1 GPU: log2(1 + 1e-15) ~ 1.6e-15, so any
    # wait puts it first), then wait / (log2 n x r): j0 100 / (2 x 1000) = 0.05 before
    # j2 10 / (1 x 550) = 0.018
    jobs, h = _hand_queue(limits=False)
    assert _window(F1Unicep(), jobs, h, 100.0) == [1, 0, 2]
    # with requests, f1: log10(r) n + 870 log10(s): j0 4 x 3 + 0 = 12, j1 2 + 870
    # log10(51) = 1487.6, j2 2 log10(550) + 870 log10(91) = 1709.8
    jobs, h = _hand_queue(limits=True)
    assert _window(F1Unicep(), jobs, h, 100.0) == [0, 1, 2]


def test_the_rule_follows_the_share_of_informed_jobs() -> None:
    plain, _ = _hand_queue(limits=False)
    asked, h = _hand_queue(limits=True)
    p = F1Unicep()
    p.reset(PolicyContext(CLUSTER, h))
    assert p.uses_f1()  # nothing seen yet: f1
    p.add(plain[0])
    assert not p.uses_f1()  # 0 of 1
    p.add(asked[1])
    assert p.uses_f1()  # 1 of 2: half
    p.add(plain[2])
    assert not p.uses_f1()  # 1 of 3
    # a user alone informs too (f1 predicts from the user's last runs)
    p.add(QueuedJob(7, "u", 95.0, 1, user="alice"))
    assert p.uses_f1()  # 2 of 4
    # a preempted job comes back (it has run): counted once, when it arrived
    back = QueuedJob(8, "v", 96.0, 1)
    p.add(back)
    assert not p.uses_f1()  # 2 of 5
    p.remove(back)
    back.runs = 1
    p.add(asked[0])  # 3 of 6
    assert p.uses_f1()
    p.add(back)  # still 3 of 6, not 3 of 7
    assert (p.n_informed, p.n_seen) == (3, 6)
    assert p.uses_f1()


def _queue(rng: np.random.Generator, n: int, identity: bool) -> tuple[list[QueuedJob], History]:
    """`n` jobs of a few VCs (with `identity`: users, half with requests), many in one
    second, and a history of finished jobs."""
    users = [f"u{i}" for i in range(int(rng.integers(1, 8)))]
    history = History()
    for k in range(int(rng.integers(0, 40))):
        done = QueuedJob(
            10_000 + k, "h", 0.0, int(rng.choice([1, 2, 8])), vc=f"vc{k % 3}",
            user=str(rng.choice(users)) if identity else "",
        )  # fmt: skip
        history.record(done, float(rng.integers(1, 20_000)))
    jobs = []
    t = float(rng.integers(0, 10**6))
    for i in range(n):
        if rng.random() < 0.6:
            t += float(rng.exponential(600.0))
        ask = float(rng.integers(60, 86_400)) if identity and rng.random() < 0.5 else None
        jobs.append(
            QueuedJob(
                i, f"j{i}", t, int(rng.choice([1, 1, 2, 4, 8, 16, 32])), vc=f"vc{i % 3}",
                user=str(rng.choice(users)) if identity else "", time_limit_s=ask,
            )
        )  # fmt: skip
    return jobs, history


def test_window_is_the_f1_or_the_unicep_modules() -> None:
    rng = np.random.default_rng(3)
    for trial in range(40):
        identity = trial % 2 == 0
        jobs, h = _queue(rng, int(rng.integers(2, 150)), identity)
        now = jobs[-1].submit_s + float(rng.integers(0, 10**5))
        ref = make_policy("f1" if identity else "unicep")
        ref.reset(PolicyContext(CLUSTER, h))
        for j in jobs:
            ref.add(j)
        want = [j.seq for j in ref.window(64, _obs(jobs, h, now))]
        assert _window(F1Unicep(), jobs, h, now, 64) == want, trial


def test_encoder_carries_unicep_s_key() -> None:
    rng = np.random.default_rng(5)
    for trial in range(30):
        jobs, h = _queue(rng, int(rng.integers(2, 100)), identity=trial % 3 == 0)
        now = jobs[-1].submit_s + float(rng.integers(0, 10**5))
        obs = _obs(jobs, h, now)
        x, _ = encode(jobs, obs, len(jobs), origin_s=jobs[0].submit_s, unicep=True)
        key = x[:, KEY].astype(np.float64) + x[:, REST].astype(np.float64)
        # the per-job reference encoder, written apart, gives the same key
        y, _ = encode_per_job(jobs, obs, len(jobs), jobs[0].submit_s, unicep=True)
        ref = y[:, KEY].astype(np.float64) + y[:, REST].astype(np.float64)
        np.testing.assert_allclose(key, ref, rtol=0, atol=1e-9)
        # its order is the unicep module's score order (score, submit, seq)
        u = make_policy("unicep")
        u.reset(PolicyContext(CLUSTER, h))
        scores = [u.job_key(j, obs) for j in jobs]  # type: ignore[attr-defined]
        want = sorted(range(len(jobs)), key=lambda i: scores[i])
        got = sorted(range(len(jobs)), key=lambda i: (key[i], jobs[i].submit_s, i))
        assert got == want, trial
        # one key by hand: log10(log2(n + 1e-15)) + log10(max(r, 1)) - log10(wait + 1e-15),
        # r the request, else the user's last runs, else its VC's and size's, VC's, 1 h
        j = jobs[-1]
        r = max(
            j.time_limit_s
            or h.predict(j.user, None)
            or h.mean_run(j.who, j.num_gpus)
            or h.mean_run_any(j.who)
            or 3600.0,
            1.0,
        )
        hand = (
            math.log10(math.log2(j.num_gpus + 1e-15))
            + math.log10(r)
            - math.log10(now - j.submit_s + 1e-15)
        )
        assert abs(key[-1] - hand) < 1e-9


def test_untrained_residual_orders_every_window_as_the_module() -> None:
    rng = np.random.default_rng(11)
    for trial in range(40):
        identity = trial % 2 == 1
        jobs, h = _queue(rng, int(rng.integers(2, 200)), identity)
        obs = _obs(jobs, h, jobs[-1].submit_s + float(rng.integers(0, 10**5)))
        max_jobs = int(rng.choice([8, 32, 128]))
        mine = RLPolicy(untrained_residual(ARGS, trial), feature_list(ARGS), max_jobs=max_jobs)
        ref = F1Unicep()
        assert_same_windows(mine, ref, PolicyContext(CLUSTER, h), jobs, obs, rng, max_jobs, trial)
        assert ref.uses_f1() == identity
