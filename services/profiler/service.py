"""Profiler service: `offload.profiles` → `offload.plans` (10Cache plans).

Thin: decode a `TensorProfile`, call the pure planner with the budgets the
profile carries, publish the `PrefetchPlan` keyed by job id. A profile that
does not decode, carries no fast budget, or cannot be planned goes to
`offload.profiles.dlq` with the reason. Plan versions count up per job; they
are rebuilt from the plans topic after a restart.

The planner runs in a worker process, never on the event loop, with a time
budget (`RLTUNE_PLAN_BUDGET_S`, default 10 s): its cost grows faster than
linearly with the number of size classes, and one large profile must not stall
the service (heartbeats, probes, other profiles). A plan over budget is
refused (kind `over_budget`) and the worker is killed and started afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TypeVar

import msgspec

from shared import serving
from shared.bus import Outgoing, Record, ServiceSpec, ServiceStats
from shared.config import BusSettings
from shared.errors import UserError
from shared.messages import PrefetchPlan, TensorProfile, encode
from shared.offload.planner import Budgets, PlanError, build_plan
from shared.reject import Reject

__all__ = ["PlanWorker", "ProfileHandler", "plan_budget_s", "serve", "service_spec"]

_T = TypeVar("_T")

NAME = "profiler"
DEFAULT_BUDGET_S = 10.0


def plan_budget_s() -> float:
    """`RLTUNE_PLAN_BUDGET_S` (seconds, > 0), else DEFAULT_BUDGET_S."""
    text = os.environ.get("RLTUNE_PLAN_BUDGET_S", "")
    try:
        value = float(text) if text else DEFAULT_BUDGET_S
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise UserError(f"RLTUNE_PLAN_BUDGET_S={text!r} must be a positive number of seconds")
    return value


class OverBudget(Exception):
    """The planner did not finish within its budget."""


def _work(conn: Connection) -> None:  # pragma: no cover - runs in the worker process
    """The worker: plan each (profile, fast, host, version) it is sent, answer with
    ("ok", plan JSON) or ("refused", reason). It ends quietly when its service closes
    the pipe (a service that stops, or drops this worker, says nothing more to it)."""
    dec = msgspec.json.Decoder(TensorProfile)
    with contextlib.suppress(EOFError, OSError):
        conn.send("ready")
        while True:
            raw, fast, host, version = conn.recv()
            try:
                plan = build_plan(dec.decode(raw), Budgets(fast, host), version=version)
                conn.send(("ok", encode(plan)))
            except PlanError as exc:
                conn.send(("refused", str(exc)))
            except Exception as exc:  # a planner bug: the service dead-letters it with this
                conn.send(("bug", f"{type(exc).__name__}: {exc}"))


_START_TIMEOUT_S = 120.0


async def _blocking(call: Callable[[], _T], timeout_s: float) -> _T:
    """`call()` on a worker thread, TimeoutError after `timeout_s`.

    The pipe stays in blocking mode and is never registered with the event loop:
    an event loop that polls a descriptor switches it to non-blocking (libuv does),
    and a `Connection.send` of more than the pipe's buffer then fails half-written
    with BlockingIOError, leaving the next answer out of step with its question. A
    thread left blocked after a timeout is released when the worker is killed and
    the pipe closes under it."""
    return await asyncio.wait_for(asyncio.to_thread(call), timeout_s)


def _wait_readable(conn: Connection, timeout_s: float) -> Callable[[], None]:
    def wait() -> None:
        if not conn.poll(timeout_s):
            raise TimeoutError(f"no answer in {timeout_s:g} s")

    return wait


class PlanWorker:
    """One planner process, killed and replaced when a plan runs over budget."""

    def __init__(self) -> None:
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        weakref.finalize(self, PlanWorker._kill, self.__dict__)

    async def _start(self) -> Connection:
        """The worker's end of the pipe, once it has started (its imports take a while,
        which must not count against a plan's budget)."""
        if self._proc is None or not self._proc.is_alive() or self._conn is None:
            self.close()
            ctx = multiprocessing.get_context("spawn")
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_work, args=(theirs,), name="rltune-planner", daemon=True)
            proc.start()
            theirs.close()
            self._proc, self._conn = proc, mine
            try:
                await _blocking(_wait_readable(mine, _START_TIMEOUT_S), _START_TIMEOUT_S + 1)
                await _blocking(mine.recv, _START_TIMEOUT_S)  # "ready"
            except (TimeoutError, EOFError, OSError) as exc:
                self.close()
                raise RuntimeError(f"the planner process did not start: {exc!r}") from None
        return self._conn

    async def plan(self, raw: bytes, budgets: Budgets, version: int, budget_s: float) -> bytes:
        """The plan's JSON; PlanError if the planner refuses; OverBudget after `budget_s`."""
        conn = await self._start()
        deadline = asyncio.get_running_loop().time() + budget_s
        try:
            await _blocking(
                partial(conn.send, (raw, budgets.fast, budgets.host, version)), budget_s
            )
            left = max(deadline - asyncio.get_running_loop().time(), 0.0)
            await _blocking(_wait_readable(conn, left), left + 1)
            kind, body = await _blocking(conn.recv, budget_s)
        except (TimeoutError, EOFError, OSError) as exc:
            self.close()
            raise OverBudget(str(exc)) from None
        if kind == "ok":
            return bytes(body)
        if kind == "refused":
            raise PlanError(body)
        raise RuntimeError(f"planner failed: {body}")

    def close(self) -> None:
        PlanWorker._kill(self.__dict__)

    @staticmethod
    def _kill(state: dict[str, object]) -> None:
        proc, conn = state.get("_proc"), state.get("_conn")
        state["_proc"] = state["_conn"] = None
        if isinstance(conn, Connection):
            conn.close()
        if isinstance(proc, BaseProcess) and proc.is_alive():
            proc.kill()
            proc.join(5)


class ProfileHandler:
    def __init__(self, settings: BusSettings, stats: ServiceStats) -> None:
        self.plans_topic = settings.topics.offload_plans
        self.stats = stats
        self.versions: dict[str, int] = {}
        self.budget_s = plan_budget_s()
        self.worker = PlanWorker()
        self._profile = msgspec.json.Decoder(TensorProfile)
        self._plan = msgspec.json.Decoder(PrefetchPlan)

    async def __call__(self, rec: Record) -> Sequence[Outgoing]:
        try:
            profile = self._profile.decode(rec.value or b"")
        except (msgspec.MsgspecError, RecursionError) as exc:
            raise Reject(f"not a TensorProfile: {exc}") from exc
        except UnicodeDecodeError as exc:  # msgspec decodes strings with Python's codec
            raise Reject(f"not a TensorProfile: a string is not valid UTF-8 ({exc})") from exc
        if profile.fast_budget_bytes <= 0:
            raise Reject(
                f"profile of {profile.job_id} has no fast_budget_bytes to plan for",
                key=profile.job_id,
            )
        version = self.versions.get(profile.job_id, 0) + 1
        budgets = Budgets(profile.fast_budget_bytes, profile.host_budget_bytes)
        try:
            plan = await self.worker.plan(rec.value or b"", budgets, version, self.budget_s)
        except PlanError as exc:
            raise Reject(str(exc), key=profile.job_id, kind="unplannable") from exc
        except OverBudget:
            raise Reject(
                f"planning {len(profile.tensors)} tensors took longer than the planner's "
                f"budget of {self.budget_s:g} s (RLTUNE_PLAN_BUDGET_S)",
                key=profile.job_id,
                kind="over_budget",
            ) from None
        self.versions[profile.job_id] = version
        self.stats.extra["plans"] += 1
        return [Outgoing(self.plans_topic, profile.job_id, plan)]

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
    return await serving.serve(settings, service_spec, stop, ready, group_id)
