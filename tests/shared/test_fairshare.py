"""Fair share from decayed usage (shared/fairshare.py): decays solved by hand, the
factor against Slurm's classic formula written out separately, and drf's order on
a hand-made state."""

from __future__ import annotations

import math

import pytest

from services.scoring.policies import make_policy
from shared.cluster import QueueSpec, parse_cluster
from shared.errors import UserError
from shared.fairshare import FairShare, Ledger, Row, factors
from shared.policy_api import QueuedJob, policy_context
from tests.services.scoring.test_policies import Obs

H = 3600.0  # a one-hour half-life keeps the numbers readable


def test_a_half_life_later_usage_halves_exactly() -> None:
    led = Ledger(H)
    led.change("a", 0.0, 4.0)
    led.change("a", 100.0, -4.0)  # 4 GPUs for 100 s, decaying meanwhile
    u = led.usage("a", 100.0)
    assert led.usage("a", 100.0 + H) == u / 2  # exactly: 2^-1
    assert led.usage("a", 100.0 + 3 * H) == u / 8
    assert led.usage("a", 50.0) == led.usage("a", 100.0)  # before as_of: as of as_of


def test_running_usage_is_the_decayed_integral() -> None:
    # g GPUs over [0, T], seen at T: ∫0^T g 2^(-(T-x)/H) dx = g H/ln2 (1 - 2^(-T/H))
    led = Ledger(H)
    led.change("a", 0.0, 2.0)
    assert led.usage("a", H) == pytest.approx(2.0 * H / math.log(2) * 0.5, rel=1e-12)
    # a short run barely decays: about g * T
    assert led.usage("a", 1.0) == pytest.approx(2.0, rel=1e-3)
    # in steps (Slurm's PriorityCalcPeriod, here 1 s) the sum tends to the same figure
    step, u = 1.0, 0.0
    for _ in range(int(H)):
        u = u * 2.0 ** (-step / H) + 2.0 * step
    assert led.usage("a", H) == pytest.approx(u, rel=1e-3)


def test_changes_compose_and_stale_events_count_at_as_of() -> None:
    led = Ledger(H)
    led.change("a", 0.0, 1.0)
    led.change("a", H, 1.0)  # 2 GPUs from H
    led.change("a", 2 * H, -2.0)
    one = H / math.log(2)  # what 1 GPU over one half-life leaves at its end: one/2
    want = (one * 0.5) * 0.5 + 2 * one * 0.5
    assert led.usage("a", 2 * H) == pytest.approx(want, rel=1e-12)
    before = led.rows["a"]
    led.change("a", H, 0.0)  # older than as_of: counts at as_of, changes nothing
    assert led.rows["a"] == before


def slurm_classic(
    raw: dict[str, float], shares: dict[str, float], parent: dict[str, str | None]
) -> dict[str, float]:
    """Slurm's classic fair share, written out from slurm.schedmd.com/classic_fair_share:
    S = Π S_raw/S_siblings up the tree; U = usage/total; UE = U at the top, else
    U + (UE_parent - U) * S_raw/S_siblings; F = 2^(-UE/S). `raw` already sums teams
    into orgs."""
    total = sum(u for q, u in raw.items() if parent[q] is None)

    def sib(q: str) -> float:
        return sum(shares[o] for o in shares if parent[o] == parent[q])

    def S(q: str) -> float:
        p = parent[q]
        return shares[q] / sib(q) * (S(p) if p else 1.0)

    def UE(q: str) -> float:
        p, u = parent[q], raw[q] / total
        return u if p is None else u + (UE(p) - u) * shares[q] / sib(q)

    return {q: 2 ** (-UE(q) / S(q)) for q in raw}


def test_factor_matches_slurms_classic_formula_on_two_levels() -> None:
    queues = {
        "research": QueueSpec(weight=3),
        "product": QueueSpec(weight=1),
        "nlp": QueueSpec(parent="research", weight=1),
        "vision": QueueSpec(parent="research", weight=2),
        "ads": QueueSpec(parent="product", weight=1),
    }
    own = {"nlp": 500.0, "vision": 100.0, "ads": 400.0, "research": 0.0, "product": 0.0}
    got = factors(own, queues)
    raw = {**own, "research": 600.0, "product": 400.0}
    parent = {q: s.parent for q, s in queues.items()}
    want = slurm_classic(raw, {q: s.weight for q, s in queues.items()}, parent)
    assert got == pytest.approx(want, rel=1e-12)
    # by hand for two of them: product S = 1/4, U = 0.4: F = 2^-1.6
    assert got["product"] == pytest.approx(2**-1.6)
    # nlp: S = 1/3 * 3/4 = 1/4; U = 0.5; UE = 0.5 + (0.6 - 0.5) * 1/3
    assert got["nlp"] == pytest.approx(2 ** (-(0.5 + 0.1 / 3) / 0.25))
    # no usage at all: every factor 1; exactly the share used: 0.5
    assert set(factors({}, queues).values()) == {1.0}
    flat = factors({"a": 1.0, "b": 1.0}, {})
    assert flat == {"a": 0.5, "b": 0.5}


def test_cluster_file_half_life() -> None:
    base = {"nodes": [{"name": "n", "count": 1, "gpu_type": "V100", "gpus": 8}]}
    assert parse_cluster(base).half_life_s == 7 * 86400.0  # Slurm's default
    assert parse_cluster({**base, "fair_share": {"half_life_h": 2}}).half_life_s == 7200.0
    with pytest.raises(UserError, match="half_life_h must be a positive number"):
        parse_cluster({**base, "fair_share": {"half_life_h": 0}})
    with pytest.raises(UserError, match="unknown key 'half_life'"):
        parse_cluster({**base, "fair_share": {"half_life": 2}})


class FairObs(Obs):
    def __init__(self, fair: FairShare, now: float, vc_held: dict[str, float]) -> None:
        super().__init__(now, vc_held)
        self._fair = fair

    def fair_share(self, vc: str) -> float:
        return self._fair.factor(vc, self.now)


def test_drf_breaks_ties_by_decayed_usage_and_allocation_goes_first() -> None:
    cluster = parse_cluster(
        {
            "nodes": [{"name": "n", "count": 2, "gpu_type": "P100", "gpus": 8}],
            "fair_share": {"half_life_h": 1},
        }
    )
    fair = FairShare(cluster)
    fair.change("a", 0.0, 8.0)  # a used 8 GPUs for an hour; b 2 GPUs for an hour
    fair.change("a", H, -8.0)
    fair.change("b", 0.0, 2.0)
    fair.change("b", H, -2.0)
    assert fair.factor("b", H) > fair.factor("a", H)
    jobs = [
        QueuedJob(0, "j0", 0.0, 1, vc="a"),
        QueuedJob(1, "j1", 1.0, 1, vc="b"),
        QueuedJob(2, "j2", 2.0, 1, vc="a"),
    ]

    def order(obs: FairObs) -> list[int]:
        p = make_policy("drf")
        p.reset(policy_context(p, cluster, obs.history))
        for j in jobs:
            p.add(j)
        return [j.seq for j in p.window(10, obs)]

    # nothing running: the same share (0), so b, with less decayed usage, goes first
    assert order(FairObs(fair, H, {})) == [1, 0, 2]
    # current allocation decides first: b holding 1 GPU goes after a holding none
    assert order(FairObs(fair, H, {"b": 1.0})) == [0, 2, 1]


def test_row_never_holds_a_negative_rate() -> None:
    r = Row().change(0.0, 1.0, H).change(5.0, -1.0, H)
    assert r.gpus == 0.0
    assert r.usage == pytest.approx(5.0, rel=1e-3)


def test_the_feature_is_the_queues_factor_and_optional() -> None:
    from services.scoring.rl.args import FEATURE_SETS
    from services.scoring.rl.checkpoint import load_checkpoint
    from shared.policy_features import IDENTITY_FEATURES, JOB_FEATURES, encode
    from shared.sim.observe import SimObservation, WaitingIndex
    from shared.sim.state import ClusterState

    cluster = parse_cluster(
        {
            "nodes": [{"name": "n", "count": 2, "gpu_type": "P100", "gpus": 8}],
            "fair_share": {"half_life_h": 1},
        }
    )
    fair = FairShare(cluster)
    fair.change("a", 0.0, 6.0)
    fair.change("b", 0.0, 2.0)  # at H: a used 3/4 of everything, b 1/4; shares 1/2 each
    obs = SimObservation(ClusterState(cluster), WaitingIndex(), Obs().history, {}, fair)
    obs.now = H
    jobs = [QueuedJob(0, "j0", 0.0, 1, vc="a"), QueuedJob(1, "j1", 0.0, 1, vc="b")]
    x, _ = encode(jobs, obs, 4)
    col = x[:2, JOB_FEATURES.index("fair_share")]
    assert col.tolist() == pytest.approx([2 ** (-0.75 / 0.5), 2 ** (-0.25 / 0.5)], rel=1e-6)
    plain = SimObservation(ClusterState(cluster), WaitingIndex(), Obs().history, {})
    assert encode(jobs, plain, 4)[0][:2, JOB_FEATURES.index("fair_share")].tolist() == [1.0, 1.0]
    # no feature set but "fair-share" reads it, nor does the shipped checkpoint
    assert [k for k, v in FEATURE_SETS.items() if "fair_share" in v] == ["fair-share"]
    assert "fair_share" not in load_checkpoint("models/rl.pt").features
    assert "fair_share" not in IDENTITY_FEATURES
