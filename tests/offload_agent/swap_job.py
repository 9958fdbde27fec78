"""One training process with default swap settings, for the two-process test:
`python -m tests.offload_agent.swap_job STEPS_BEFORE STEPS_AFTER WAIT_FOR SIGNAL OUT`.

It trains `STEPS_BEFORE` steps, writes `SIGNAL`, waits for the file `WAIT_FOR`,
trains `STEPS_AFTER` more, cleans up, and writes its losses, its swap directory
and the files it wrote to `OUT` (JSON)."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from offload_agent.device import CpuDevice
from offload_agent.engine import EngineConfig, OffloadEngine
from offload_agent.gpt import GPT
from offload_agent.nvme import NvmeStore, swap_dir
from offload_agent.optim import AdamW
from tests.offload_agent.tiny import PARAM_BYTES, TINY, train


def main(before: int, after: int, wait_for: Path, signal: Path, out: Path) -> None:
    torch.manual_seed(0)
    store = NvmeStore(swap_dir())  # the defaults: same root, same job id for both
    with ThreadPoolExecutor(2) as io:
        engine = OffloadEngine(
            GPT(TINY),
            AdamW(lr=1e-3),
            EngineConfig(strategy="lru", fast_budget=int(PARAM_BYTES * 1.2), host_budget=0),
            device=CpuDevice(),
            store=store,
            io=io,
        )
        engine.start()
        losses = train(engine, before)
        files = sorted(str(p) for p in store.dir.glob("*.swap"))
        signal.touch()
        while not wait_for.exists():
            time.sleep(0.05)
        losses += train(engine, after, start=before)
        engine.close()
        store.remove_all()
    out.write_text(json.dumps({"losses": losses, "dir": str(store.dir), "files": files}))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), Path(a[2]), Path(a[3]), Path(a[4]))
