"""Only an oracle policy can reach a job's true run time (shared.policy_api).

Two checks: structurally, every non-oracle policy (each baseline and the learned
one) is reset by the simulator with a context that has no run-time field; and by
behaviour, rescaling the run times of jobs that have not finished changes no
start time before the first of them finishes, while `sjf-oracle` (the canary)
does change, so the check can fail.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from services.placement.registry import make_placer
from services.scoring.policies import BASELINES, make_policy
from services.scoring.rl import RLPolicy
from services.scoring.rl.network import NetConfig, ScoreNet
from shared.cluster import parse_cluster
from shared.policy_api import History, OracleContext, Policy, PolicyContext, policy_context
from shared.policy_features import GLOBAL_FEATURES, JOB_FEATURES
from shared.sim import SimConfig, simulate
from tests.shared.canary_trace import SHORT_END, canary_trace

CLUSTER = parse_cluster(
    {"reference": "P100",
     "nodes": [{"name": "p", "count": 1, "gpu_type": "P100", "gpus": 4},
               {"name": "k", "count": 1, "gpu_type": "K80", "gpus": 2}]}
)  # fmt: skip


def _rl() -> RLPolicy:
    torch.manual_seed(0)
    net = ScoreNet(NetConfig(len(JOB_FEATURES), len(GLOBAL_FEATURES), hidden=8))
    with torch.no_grad():
        net.linear.weight.normal_()
    return RLPolicy(net, JOB_FEATURES)


def _policy(name: str) -> Policy:
    return _rl() if name == "rl" else make_policy(name)


NAMES = [*BASELINES, "rl"]


def test_plain_context_has_no_run_time_field() -> None:
    assert not any("run" in f.name for f in dataclasses.fields(PolicyContext))
    assert "true_run_s" in {f.name for f in dataclasses.fields(OracleContext)}


@pytest.mark.parametrize("name", NAMES)
def test_only_oracles_are_handed_run_times(name: str) -> None:
    policy = _policy(name)
    seen: list[PolicyContext] = []
    reset = policy.reset

    def spy(ctx: PolicyContext) -> None:
        seen.append(ctx)
        reset(ctx)

    policy.reset = spy  # type: ignore[method-assign]
    simulate(canary_trace(None), CLUSTER, policy, make_placer("greedy"), SimConfig(window=16))
    assert len(seen) == 1
    assert isinstance(seen[0], OracleContext) is policy.oracle
    assert hasattr(seen[0], "true_run_s") is policy.oracle
    direct = policy_context(policy, CLUSTER, History(), 0, lambda j: 1.0)
    assert isinstance(direct, OracleContext) is policy.oracle


def test_an_oracle_without_run_times_is_refused() -> None:
    policy = make_policy("sjf-oracle")
    with pytest.raises(ValueError, match="true run times"):
        policy.reset(policy_context(policy, CLUSTER, History(), 0, None))


def _early_starts(name: str, scale: np.ndarray | None) -> dict[str, float]:
    res = simulate(canary_trace(scale), CLUSTER, _policy(name), make_placer("greedy"), SimConfig())
    return {
        r.job_id: r.segments[0].start_s
        for r in res.records
        if r.segments and r.segments[0].start_s < SHORT_END
    }


@pytest.mark.parametrize("name", NAMES)
def test_decisions_do_not_depend_on_unfinished_run_times(name: str) -> None:
    """Before the first rescaled job finishes nothing may differ, except for an oracle
    (sjf-oracle's starts do differ: the canary sees a policy that reads run times;
    f1-oracle's order here is mostly its submit-time term, which the rescaling leaves)."""
    scales = np.random.default_rng(2).uniform(1.0, 5.0, size=30)
    a, b = _early_starts(name, None), _early_starts(name, scales)
    assert len(a) >= 12  # the long jobs really started and queued in this span
    if not _policy(name).oracle:
        assert a == b
    elif name == "sjf-oracle":
        assert a != b
