"""Profiler service: `offload.profiles` → `offload.plans` (10Cache plans).

Thin: decode a `TensorProfile`, call the pure planner with the budgets the
profile carries, publish the `PrefetchPlan` keyed by job id. A profile that
does not decode, carries no fast budget, or cannot be planned goes to
`offload.profiles.dlq` with the reason. Plan versions count up per job; they
are rebuilt from the plans topic after a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from services.profiler.planner import Budgets, PlanError, build_plan
from shared.bus import Outgoing, Record, ServiceSpec, ServiceStats, serve_service
from shared.config import BusSettings
from shared.messages import PrefetchPlan, TensorProfile, encode
from shared.reject import Reject

__all__ = ["ProfileHandler", "serve", "service_spec"]

NAME = "profiler"


class ProfileHandler:
    def __init__(self, settings: BusSettings, stats: ServiceStats) -> None:
        self.plans_topic = settings.topics.offload_plans
        self.stats = stats
        self.versions: dict[str, int] = {}
        self._profile = msgspec.json.Decoder(TensorProfile)
        self._plan = msgspec.json.Decoder(PrefetchPlan)

    def __call__(self, rec: Record) -> Sequence[Outgoing]:
        try:
            profile = self._profile.decode(rec.value or b"")
        except msgspec.MsgspecError as exc:
            raise Reject(f"not a TensorProfile: {exc}") from exc
        if profile.fast_budget_bytes <= 0:
            raise Reject(
                f"profile of {profile.job_id} has no fast_budget_bytes to plan for",
                key=profile.job_id,
            )
        version = self.versions.get(profile.job_id, 0) + 1
        budgets = Budgets(profile.fast_budget_bytes, profile.host_budget_bytes)
        try:
            plan = build_plan(profile, budgets, version=version)
        except PlanError as exc:
            raise Reject(str(exc), key=profile.job_id, kind="unplannable") from exc
        self.versions[profile.job_id] = version
        self.stats.extra["plans"] += 1
        return [Outgoing(self.plans_topic, profile.job_id, encode(plan))]

    def replay(self, rec: Record) -> None:
        """Remember the last plan version of each job."""
        if rec.topic != self.plans_topic:
            return
        try:
            plan = self._plan.decode(rec.value or b"")
        except msgspec.MsgspecError:
            return
        self.versions[plan.job_id] = max(self.versions.get(plan.job_id, 0), plan.version)


def service_spec(settings: BusSettings, stats: ServiceStats) -> ServiceSpec:
    t = settings.topics
    handler = ProfileHandler(settings, stats)
    return ServiceSpec(
        name=NAME,
        topics=[t.offload_profiles],
        handle=handler,
        replay_topics=[t.offload_plans],
        replay=handler.replay,
    )


async def serve(
    settings: BusSettings,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    group_id: str | None = None,
) -> ServiceStats:
    return await serve_service(settings, service_spec, stop, ready, group_id)
