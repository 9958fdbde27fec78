"""Small engines on a tiny GPT, real swap files under tmp_path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from offload_agent.device import CpuDevice, deterministic_cuda
from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.gpt import GPT
from offload_agent.nvme import NvmeStore
from offload_agent.optim import AdamW
from tests.offload_agent.tiny import PARAM_BYTES, TINY, MakeEngine

if os.environ.get("RLTUNE_TEST_DEVICE", "cpu").startswith("cuda"):
    deterministic_cuda()  # the comparisons are bit for bit


@pytest.fixture
def io() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2, thread_name_prefix="test-io") as pool:
        yield pool


@pytest.fixture
def make_engine(tmp_path: Path, io: ThreadPoolExecutor) -> Iterator[MakeEngine]:
    made: list[OffloadEngine] = []

    def make(
        strategy: str = "tencache",
        *,
        fast: float = 1.5,
        host: float = 0.3,
        store: NvmeStore | None = None,
        device: CpuDevice | None = None,
        job_id: str = "job-1",
        model: type[GPT] = GPT,
        accumulation_steps: int = 1,
    ) -> OffloadEngine:
        torch.manual_seed(0)
        engine = OffloadEngine(
            model(TINY),
            AdamW(lr=1e-3),
            EngineConfig(
                job_id=job_id,
                strategy=strategy,
                fast_budget=int(PARAM_BYTES * fast),
                host_budget=int(PARAM_BYTES * host),
                accumulation_steps=accumulation_steps,
            ),
            device=device or CpuDevice(),
            store=store if store is not None else NvmeStore(tmp_path / f"swap-{strategy}"),
            io=io,
        )
        engine.start()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
