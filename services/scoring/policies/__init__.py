"""Baseline prioritisation policies, one module each, all `shared.policy_api.Policy`.

`make_policy(name)` builds one by its `--policy` name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from services.scoring.policies.drf import Drf
from services.scoring.policies.f1 import F1
from services.scoring.policies.f1_oracle import F1Oracle
from services.scoring.policies.f1_unicep import F1Unicep
from services.scoring.policies.fifo import Fifo
from services.scoring.policies.las import Las
from services.scoring.policies.multifactor import Multifactor
from services.scoring.policies.random_order import RandomOrder
from services.scoring.policies.sjf_est import SjfEstimate
from services.scoring.policies.sjf_oracle import SjfOracle
from services.scoring.policies.sjf_req import SjfRequest
from services.scoring.policies.smallest import Smallest
from services.scoring.policies.unicep import Unicep
from services.scoring.policies.wfp3 import Wfp3
from shared.errors import UserError
from shared.policy_api import Policy

__all__ = ["BASELINES", "POLICIES", "make_policy"]

POLICIES: dict[str, Callable[[], Policy]] = {
    "fifo": Fifo,
    "sjf-oracle": SjfOracle,
    "sjf-est": SjfEstimate,
    "sjf-req": SjfRequest,
    "smallest": Smallest,
    "f1": F1,
    "f1-oracle": F1Oracle,
    "wfp3": Wfp3,
    "unicep": Unicep,
    "f1-unicep": F1Unicep,
    "multifactor": Multifactor,
    "las": Las,
    "drf": Drf,
    "random": RandomOrder,
}
BASELINES = tuple(POLICIES)


RL_MODULE = "services.scoring.rl"  # provides load_policy(path: str | None) -> Policy


def make_policy(name: str) -> Policy:
    """A fresh policy object by `--policy` name; UserError naming the choices if unknown.

    `rl:PATH` (a checkpoint) and `rl` (the shipped one) are loaded by
    `RL_MODULE.load_policy(PATH or None)`, imported only when asked for.
    """
    if name in POLICIES:
        return POLICIES[name]()
    if name == "rl" or name.startswith("rl:"):
        try:
            mod = importlib.import_module(RL_MODULE)
        except ModuleNotFoundError as exc:
            if exc.name != RL_MODULE:
                raise
            raise UserError(
                f"policy {name!r}: the RL policy is not built into this checkout"
            ) from None
        policy: Policy = mod.load_policy(name[3:] or None)
        return policy
    raise UserError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}, rl:PATH")
