"""The host's GPUs (through pynvml, from NVIDIA's `nvidia-ml-py`) and starting a
placed job's command on the GPUs it was given.

Both have a path for hosts without a GPU (every machine here): `gpu_inventory`
returns an empty list, `node_status` returns None, and `launch` still starts
the command, with `CUDA_VISIBLE_DEVICES` set to the assigned indices.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from shared.messages import NodeStatus

__all__ = ["Gpu", "gpu_inventory", "launch", "node_status"]


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    name: str
    util: float  # 0..1
    mem_used: int
    mem_total: int
    running: int  # compute processes on it


def gpu_inventory() -> list[Gpu]:
    """Every GPU pynvml sees; [] without the NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            name = pynvml.nvmlDeviceGetName(h)
            out.append(
                Gpu(
                    i,
                    name.decode() if isinstance(name, bytes) else str(name),
                    util.gpu / 100.0,
                    int(mem.used),
                    int(mem.total),
                    len(procs),
                )
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def node_status(node_id: str, gpus: Sequence[Gpu] | None = None) -> NodeStatus | None:
    """This host as a `NodeStatus`, or None when it has no GPU."""
    gpus = gpu_inventory() if gpus is None else gpus
    if not gpus:
        return None
    used = sum(g.mem_used for g in gpus)
    total = sum(g.mem_total for g in gpus) or 1
    return NodeStatus(
        node_id=node_id,
        gpu_type=_short_type(gpus[0].name),
        gpus=len(gpus),
        free_gpus=[g.index for g in gpus if g.running == 0],
        gpu_util=sum(g.util for g in gpus) / len(gpus),
        gpu_mem_used=used / total,
        time=time.time(),
    )


def _short_type(name: str) -> str:
    """'NVIDIA A100-SXM4-40GB' -> 'A100' (the cluster spec's GPU type names)."""
    for word in name.replace("-", " ").split():
        if any(c.isdigit() for c in word) and word.upper() != "NVIDIA":
            return word.upper()
    return name


def launch(
    command: Sequence[str],
    gpu_indices: Sequence[int],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a placed job's command on its GPUs (its output where `stdout` / `stderr`
    say, else the caller's)."""
    if not command:
        raise ValueError("a job without a command cannot be launched")
    full = dict(os.environ if env is None else env)
    full["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_indices)
    # its own session: a kill on request reaches every process the command started
    return subprocess.Popen(
        list(command),
        env=full,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )
