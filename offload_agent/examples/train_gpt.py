"""Train a small GPT with 10Cache offload: the engine's whole life cycle in one file.

    python -m offload_agent.examples.train_gpt --steps 6 --swap-dir /tmp/swap
    python -m offload_agent.examples.train_gpt --agent-socket /tmp/rltune-offload-agent.sock

1. Build the model as usual, then hand it to `OffloadEngine` with an AdamW
   config, the budgets of the fast tier (GPU) and pinned host memory, a swap
   directory on a local NVMe disk and a thread pool for I/O. `start()` puts
   every parameter and optimizer state at its first home (the safe default
   layout, `lru`) and installs the hooks.
2. Train inside `with engine.step():` — forward and `loss.backward()`; the
   optimizer steps each parameter inside backward, so there is no
   `optimizer.step()` in the loop.
3. The first step is the warm-up: it records the tensor order and sizes. Its
   `TensorProfile` is planned locally (the profiler service's own planner) or,
   with `--agent-socket`, sent to the host agent, which publishes it to Kafka
   and forwards the profiler service's `PrefetchPlan` back. A refused plan
   (another job's, over budget, NVMe unusable) is logged and training carries on.
4. At the end the process's `OffloadStats` go to the agent (and `--stats-out`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import torch

from offload_agent.device import select_device
from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.gpt import GPT, GPTConfig, batch
from offload_agent.ipc import AgentClient
from offload_agent.nvme import NvmeStore, swap_dir
from offload_agent.optim import AdamW
from shared.messages import OffloadStats
from shared.offload.planner import build_plan

log = logging.getLogger("train_gpt")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--job-id", default="example-gpt")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--fast-mib", type=float, default=8.0, help="fast-tier (GPU) budget")
    p.add_argument("--host-mib", type=float, default=2.0, help="pinned host budget")
    p.add_argument(
        "--swap-dir",
        type=Path,
        default=None,
        help="NVMe swap directory (default: $RLTUNE_SWAP_DIR, set by the host agent, "
        "else <tmp>/rltune-swap)",
    )
    p.add_argument(
        "--micro-batches", type=int, default=1, help="gradient accumulation: backwards per step"
    )
    p.add_argument("--agent-socket", type=Path, default=None)
    p.add_argument("--wait-plan", type=float, default=30.0, help="seconds to wait for the plan")
    p.add_argument("--stats-every", type=int, default=10, help="steps between OffloadStats")
    p.add_argument("--stats-out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse(argv)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=1024, seq=64, layers=args.layers, dim=args.dim, heads=8)
    model = GPT(cfg)
    config = EngineConfig(
        job_id=args.job_id,
        strategy="tencache",
        fast_budget=int(args.fast_mib * 2**20),
        host_budget=int(args.host_mib * 2**20),
        accumulation_steps=args.micro_batches,
    )
    client = _connect(args.agent_socket, args.job_id)
    with ThreadPoolExecutor(2, thread_name_prefix="offload-io") as io:
        store = NvmeStore(args.swap_dir or swap_dir())
        engine = OffloadEngine(
            model, AdamW(lr=3e-4), config, device=select_device(), store=store, io=io
        )
        try:
            engine.start()
        except ValueError as exc:  # budgets too small for even the in-use buffers
            log.error("%s (raise --fast-mib)", exc)
            return 2
        for step in range(args.steps):
            with engine.step():
                for micro in range(args.micro_batches):  # gradients summed over these
                    x, y = batch(cfg, 4, step * args.micro_batches + micro)
                    loss = model(x, y) / args.micro_batches
                    loss.backward()
            log.info("step %d loss %.4f (%s)", step, loss.item(), engine.setup_name)
            if step == 0:  # the warm-up step: its profile is ready
                client = _plan(engine, client, args.wait_plan)
            elif step % args.stats_every == 0 and client is not None:
                client = _send(client, engine.stats_message())
        stats = engine.stats_message()
        engine.close()
        store.remove_all()  # swap files are scratch: the model lives in `model` again
    log.info("hit rate %.3f, step %.1f ms, in %d B", stats.hit_rate, stats.step_ms, stats.bytes_in)
    if client is not None and _send(client, stats) is not None:
        client.close()
    if args.stats_out:
        args.stats_out.write_bytes(msgspec.json.encode(stats))
    return 0


def _connect(path: Path | None, job_id: str) -> AgentClient | None:
    """The host agent's client, or None (plan locally) when there is none to reach."""
    if path is None:
        return None
    client = AgentClient(path, job_id)
    try:
        client.connect()
    except OSError as exc:
        log.warning("host agent at %s unreachable (%s); planning locally", path, exc)
        return None
    return client


def _send(client: AgentClient, stats: OffloadStats) -> AgentClient | None:
    try:
        client.send_stats(stats)
        return client
    except OSError as exc:
        log.warning("host agent gone (%s); training goes on without it", exc)
        return None


def _plan(engine: OffloadEngine, client: AgentClient | None, wait_s: float) -> AgentClient | None:
    """Get a plan for the warm-up profile (agent or local) and switch to it. The
    agent client comes back, or None if the agent went away (then: local plan)."""
    plan = None
    if client is not None:
        try:
            client.send_profile(engine.profile())
            plan = client.poll_plan(timeout_s=wait_s)
        except OSError as exc:
            log.warning("host agent gone (%s); planning locally", exc)
            client = None
        if client is not None and plan is None:
            log.warning(
                "no plan from the agent in %.0f s; staying on %s", wait_s, engine.setup_name
            )
            return client
    if plan is None:
        plan = build_plan(engine.profile(), engine.budgets)
    if engine.apply_plan(plan):
        engine.stats.reset()  # measure the planned layout only
        log.info("plan v%d applied: window %d", plan.version, plan.window)
    else:
        log.error("plan refused: %s", engine.last_error)
    return client


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
