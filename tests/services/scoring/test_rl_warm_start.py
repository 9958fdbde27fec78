"""The warm start's own learning rate (`--warm-learning-rate`): imitation steps at
that rate, and PPO's rate restored after it."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from services.scoring.rl.args import FEATURE_SETS, Args
from services.scoring.rl.network import ScoreNet
from services.scoring.rl.ppo import pl_log_prob
from services.scoring.rl.rollout import Batch
from services.scoring.rl.train import make_optimizer, net_config, warm_start
from shared.policy_features import GLOBAL_FEATURES


def _batch(features: tuple[str, ...], t: int = 16, n: int = 8) -> Batch:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, n, len(features), generator=g)
    # the teacher ranks by the first feature, descending: learnable from the inputs
    teacher = torch.argsort(-x[:, :, 0], dim=1)
    return Batch(
        x=x,
        mask=torch.ones(t, n, dtype=torch.bool),
        g=torch.randn(t, len(GLOBAL_FEATURES), generator=g),
        perm=teacher.clone(),
        pulled=torch.full((t,), n),
        teacher=teacher,
        rewards=np.zeros(t),
        ends=np.ones(t, dtype=bool),
    )


def _imitation_nll(net: ScoreNet, b: Batch) -> float:
    with torch.no_grad():
        scores, _ = net(b.x, b.mask, b.g)
        return float(-pl_log_prob(scores, b.teacher, b.pulled).mean())


def _setup(warm_lr: float) -> tuple[ScoreNet, torch.optim.Optimizer, Batch, Args]:
    torch.manual_seed(0)
    args = dataclasses.replace(Args(), warm_learning_rate=warm_lr, warm_start=5)
    features = FEATURE_SETS["all"]
    net = ScoreNet(net_config(args, features))
    return net, make_optimizer(net, args), _batch(features), args


def test_zero_warm_rate_leaves_the_weights_and_restores_ppo_rate() -> None:
    net, opt, b, args = _setup(0.0)
    before = {k: v.clone() for k, v in net.named_parameters()}
    warm_start(net, opt, b, args, torch.Generator().manual_seed(1))
    for k, v in net.named_parameters():
        assert torch.equal(v, before[k]), k
    assert [grp["lr"] for grp in opt.param_groups] == [args.learning_rate]


def test_warm_rate_imitates_the_teacher() -> None:
    net, opt, b, args = _setup(1e-2)
    nll0 = _imitation_nll(net, b)
    warm_start(net, opt, b, args, torch.Generator().manual_seed(1))
    # the normalisation warm_start folds in is part of the network from now on
    assert _imitation_nll(net, b) < 0.8 * nll0
    assert [grp["lr"] for grp in opt.param_groups] == [args.learning_rate]
