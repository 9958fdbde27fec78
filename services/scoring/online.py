"""Online learning from `rl.rewards` (scoring's `--learn`, off by default).

Pure logic (no bus). With it on, the learned policy samples its rankings
(Plackett-Luce, as in training) instead of taking the most likely one, and every
round it ranks is recorded (`RLPolicy.recorder`). A `Reward` from telemetry
closes an episode: the rounds ranked since the previous reward, with the
reward's value on the last of them (what `rl.rollout.make_batch` expects of an
episode). Every `episodes` rewards, one PPO update (`rl.train.ppo_update`: the
clipped surrogate, value loss and entropy bonus the trainer uses, on the same
network object the policy ranks with) changes the weights in place; the next
round already ranks with them.

What it is and is not: on-policy PPO over live windows whose return is the
telemetry reward of the window that followed them (so credit is given to the
rounds of a window as a whole, with GAE over the rounds). The update runs on
the service's event loop between two records (a few forward/backward passes of
a small network over at most `max_steps` rounds); a deployment that cannot
afford the pause leaves the flag off and trains offline (`rltune train`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from services.scoring.rl.args import Args
from services.scoring.rl.policy import RLPolicy, Step
from services.scoring.rl.rollout import make_batch
from services.scoring.rl.train import make_optimizer, ppo_update

__all__ = ["Episode", "OnlineLearner"]


@dataclass
class Episode:
    """The rounds ranked between two rewards (what `make_batch` reads of an episode)."""

    steps: list[Step] = field(default_factory=list)
    reward: float = 0.0


class OnlineLearner:
    """Records the policy's rounds and runs a PPO update every `episodes` rewards."""

    def __init__(
        self,
        policy: RLPolicy,
        episodes: int = 4,
        max_steps: int = 512,
        seed: int = 0,
        args: Args | None = None,
    ) -> None:
        self.args = args or replace(Args(), update_epochs=2, minibatch_steps=64)
        self.episodes = episodes
        self.max_steps = max_steps
        self.gen = torch.Generator().manual_seed(seed)
        self.policy = policy
        self.opt = make_optimizer(policy.net, self.args)
        self.current = Episode()
        self.done: list[Episode] = []
        self.updates = 0
        self.last: dict[str, float] = {}
        self.attach(policy)

    def attach(self, policy: RLPolicy) -> None:
        """Learn with `policy` (a newer checkpoint swapped in: a fresh optimiser)."""
        if policy is not self.policy:
            self.opt = make_optimizer(policy.net, self.args)
            self.current, self.done = Episode(), []
        self.policy = policy
        policy.sample = True  # on-policy: the rankings PPO credits are drawn, not argmax
        policy.recorder = self

    # ---- Recorder (the policy calls these) ---------------------------------------------
    def record(self, step: Step, now: float) -> None:
        self.current.steps.append(step)
        if len(self.current.steps) > self.max_steps:  # a long gap without rewards
            del self.current.steps[0]

    def removed(self, seq: int) -> None:
        pass

    # ---- rewards ------------------------------------------------------------------------
    def reward(self, value: float) -> dict[str, float] | None:
        """A reward closes the episode; every `episodes` of them, one PPO update (its
        mean losses returned). Rewards with no round ranked since are skipped."""
        if not math.isfinite(value) or not self.current.steps:
            return None
        self.current.reward = value
        self.done.append(self.current)
        self.current = Episode()
        if len(self.done) < self.episodes:
            return None
        episodes, self.done = self.done, []
        batch = make_batch(episodes, self.policy.features)  # type: ignore[arg-type]
        if batch is None:
            return None
        net: Any = self.policy.net
        net.train()
        try:
            self.last = ppo_update(net, self.opt, batch, self.args, self.gen)
        finally:
            net.eval()
        self.updates += 1
        return self.last
