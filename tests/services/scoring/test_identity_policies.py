"""The baselines that read identity and requested times (sjf-req, wfp3, unicep, and the
estimate ladder of sjf-est, f1 and EASY): orders on literal inputs, worked out by hand
in the comments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.scoring.policies import make_policy
from shared.policy_api import History, QueuedJob
from tests.paths import PHILLY
from tests.services.scoring.test_policies import Obs, order


def J(seq: int, submit: float, gpus: int = 1, **kw: object) -> QueuedJob:
    return QueuedJob(seq, f"j{seq}", submit, gpus, **kw)  # type: ignore[arg-type]


def runs(h: History, user: str, *seconds: float, gpus: int = 1, **kw: object) -> None:
    for i, s in enumerate(seconds):
        h.record(QueuedJob(900 + i, f"h{i}", 0.0, gpus, user=user, **kw), s)  # type: ignore[arg-type]


def test_sjf_req_shortest_request_first_unrequested_last() -> None:
    jobs = [J(0, 0.0, time_limit_s=3600.0), J(1, 1.0, time_limit_s=600.0),
            J(2, 2.0), J(3, 3.0, time_limit_s=600.0)]  # fmt: skip
    # 600 (j1, older), 600 (j3), 3600 (j0), no request (j2) last
    assert order(make_policy("sjf-req"), jobs, Obs()) == [1, 3, 0, 2]


# n GPUs, submit, requested time
WAITING = [J(0, 0.0, 4, time_limit_s=1000.0), J(1, 500.0, 1, time_limit_s=100.0),
           J(2, 900.0, 8, time_limit_s=50.0), J(3, 0.0, 1, time_limit_s=4000.0)]  # fmt: skip


def test_wfp3_by_hand_and_its_order_moves_with_time() -> None:
    # now 1000: -(wait/r)^3 x n = j0 -(1000/1000)^3*4 = -4; j1 -(500/100)^3 = -125;
    # j2 -(100/50)^3*8 = -64; j3 -(1000/4000)^3 = -0.0156: lowest first
    assert order(make_policy("wfp3"), WAITING, Obs(now=1000.0)) == [1, 2, 0, 3]
    # now 2000: j0 -(2)^3*4 = -32; j1 -(15)^3 = -3375; j2 -(22)^3*8 = -85184; j3 -0.125
    assert order(make_policy("wfp3"), WAITING, Obs(now=2000.0)) == [2, 1, 0, 3]
    assert not make_policy("wfp3").time_invariant


def test_unicep_by_hand() -> None:
    # now 1000: -(wait)/(log2(n) x r): j0 -1000/(2*1000) = -0.5; j2 -100/(3*50) = -0.667;
    # one-GPU jobs: log2(1 + 1e-15) ~ 1.44e-15: j1 -500/(1.44e-15*100) ~ -3.5e15,
    # j3 -1000/(1.44e-15*4000) ~ -1.7e14
    assert order(make_policy("unicep"), WAITING, Obs(now=1000.0)) == [1, 3, 2, 0]


def test_wfp3_without_a_request_uses_the_users_history() -> None:
    obs = Obs(now=400.0)
    runs(obs.history, "u", 100.0, 300.0)  # u's last two: mean 200
    # j0 (u, no request): r = 200, -(400/200)^3 = -8; j1 (v, asks 100): -(400/100)^3 = -64
    jobs = [J(0, 0.0, user="u"), J(1, 0.0, user="v", time_limit_s=100.0)]
    assert order(make_policy("wfp3"), jobs, obs) == [1, 0]


def test_predict_is_tsafrirs_last_two_capped_by_the_request() -> None:
    h = History()
    assert h.predict("u", None) is None
    assert h.predict("u", 900.0) == 900.0  # no history: the request
    runs(h, "u", 10.0, 20.0, 30.0)
    assert h.predict("u", None) == 25.0  # the last two only
    assert h.predict("u", 22.0) == 22.0  # capped by the request
    assert h.predict("", 70.0) == 70.0  # no user named: the request
    runs(h, "w", 8.0)
    assert h.predict("w", None) == 8.0  # one finished job: that one


def test_estimate_ladder_for_easy_and_sjf_est() -> None:
    obs = Obs()
    h = obs.history
    runs(h, "u", 1000.0, 3000.0)  # u's last two: 2000
    runs(h, "w", 50.0)
    h.record(QueuedJob(950, "q", 0.0, 2, vc="q"), 900.0)  # VC q, 2 GPUs: 900
    jobs = [
        J(0, 0.0, 1, user="u", time_limit_s=1500.0),  # min(2000, 1500) = 1500
        J(1, 1.0, 1, user="u"),  # 2000
        J(2, 2.0, 1, user="x", time_limit_s=700.0),  # no history: the request, 700
        J(3, 3.0, 1, user="w", time_limit_s=10000.0),  # 50
        J(4, 4.0, 2, vc="q"),  # no user, no request: class history 900
        J(5, 5.0, 4, vc="q"),  # nothing at all: sjf-est takes it as short (0)
    ]
    assert order(make_policy("sjf-est"), jobs, obs) == [5, 3, 2, 4, 0, 1]
    # what EASY reserves with: the same, and for j5 the VC's mean over all sizes (900)
    assert [h.estimate(j) for j in jobs] == [1500.0, 2000.0, 700.0, 50.0, 900.0, 900.0]


def test_f1_on_the_best_estimate() -> None:
    obs = Obs()
    runs(obs.history, "u", 10.0, 1000.0)  # u: 505
    # log10(r) x n + 870 log10(s), s = submit - first submit + 1:
    jobs = [
        J(0, 0.0, 2, time_limit_s=100.0),  # 2 x 2 + 0 = 4
        J(1, 9.0, 1, time_limit_s=10.0),  # 1 x 1 + 870 x 1 = 871
        J(2, 0.0, 4, time_limit_s=1e6),  # 6 x 4 = 24
        J(3, 0.0, 1, user="u", time_limit_s=100.0),  # min(505, 100): 2 x 1 = 2
    ]
    assert order(make_policy("f1"), jobs, obs) == [3, 0, 2, 1]


def test_identity_stats_count_recent_log_mean_and_ratio() -> None:
    h = History()
    h.record(QueuedJob(0, "a", 0.0, 1, user="u", project="p", time_limit_s=100.0), 99.0)
    h.record(QueuedJob(1, "b", 0.0, 1, user="u", app="x"), 9.0)
    # u: 2 runs, mean(log10(100), log10(10)) = 1.5, ratio over the one with a request
    assert h.identity_stats("user", "u") == (2.0, 1.5, 0.99)
    assert h.identity_stats("project", "p") == (1.0, 2.0, 0.99)
    assert h.identity_stats("app", "x") == (1.0, 1.0, -1.0)  # no request: -1
    assert h.identity_stats("user", "nobody") is None


def test_sjf_req_on_a_trace_without_requests_is_one_line_exit_2(tmp_path: Path) -> None:
    cluster = Path(__file__).resolve().parents[3] / "clusters" / "philly.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "rltune", "simulate", "--trace", str(PHILLY), "--format",
         "philly", "--cluster", str(cluster), "--policy", "sjf-req", "--limit", "50"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "sjf-req needs time_limit_s" in lines[0]
