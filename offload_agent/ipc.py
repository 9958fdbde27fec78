"""Between a training process and its host agent: one Unix socket, one JSON
message per line, tagged msgspec Structs (decoded by one typed decoder).

process → agent: `Hello` (the job it runs), `ProfileMsg`, `StatsMsg`
agent → process: `PlanMsg`

`AgentClient` is the process side: blocking and small, so a training loop can
call `poll_plan()` between steps without an event loop.
"""

from __future__ import annotations

import os
import select
import socket
from pathlib import Path

import msgspec

from shared.messages import OffloadStats, PrefetchPlan, TensorProfile

__all__ = [
    "DEFAULT_SOCKET",
    "AgentClient",
    "Hello",
    "PlanMsg",
    "ProfileMsg",
    "StatsMsg",
    "decode",
    "encode_line",
]

DEFAULT_SOCKET = "/tmp/rltune-offload-agent.sock"
MAX_LINE = 16 << 20


class Hello(msgspec.Struct, tag="hello"):
    job_id: str
    pid: int = 0


class ProfileMsg(msgspec.Struct, tag="profile"):
    profile: TensorProfile


class StatsMsg(msgspec.Struct, tag="stats"):
    stats: OffloadStats


class PlanMsg(msgspec.Struct, tag="plan"):
    plan: PrefetchPlan


Message = Hello | ProfileMsg | StatsMsg | PlanMsg
_DECODER = msgspec.json.Decoder(Message)
_LOOSE = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


def encode_line(msg: Message) -> bytes:
    return _ENCODER.encode(msg) + b"\n"


def decode(line: bytes, node_id: str = "") -> Message:
    """One line from a training process. A process leaves its stats' node id to its
    agent, which checks them as `offload.stats` does (a non-empty node id among the
    rest): given `node_id`, an empty one is this node's before the check."""
    try:
        return _DECODER.decode(line)
    except msgspec.ValidationError:
        obj = _LOOSE.decode(line) if node_id else None
        stats = obj.get("stats") if isinstance(obj, dict) else None
        if not isinstance(stats, dict) or stats.get("node_id"):
            raise
        stats["node_id"] = node_id
        return msgspec.convert(obj, Message)


def socket_path() -> Path:
    return Path(os.environ.get("RLTUNE_OFFLOAD_SOCKET", DEFAULT_SOCKET))


class AgentClient:
    """A training process's connection to the host agent."""

    def __init__(self, path: Path, job_id: str) -> None:
        self.path = Path(path)
        self.job_id = job_id
        self._sock: socket.socket | None = None
        self._buf = b""

    def connect(self, timeout_s: float = 5.0) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(str(self.path))
        self._sock = sock
        self._send(Hello(self.job_id, os.getpid()))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def send_profile(self, profile: TensorProfile) -> None:
        self._send(ProfileMsg(profile))

    def send_stats(self, stats: OffloadStats) -> None:
        self._send(StatsMsg(stats))

    def poll_plan(self, timeout_s: float = 0.0) -> PrefetchPlan | None:
        """The next plan the agent forwarded, waiting at most `timeout_s`."""
        sock = self._connected()
        while b"\n" not in self._buf:
            ready, _, _ = select.select([sock], [], [], timeout_s)
            if not ready:
                return None
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"host agent at {self.path} closed the connection")
            self._buf += chunk
            if len(self._buf) > MAX_LINE:
                raise ConnectionError("host agent sent an oversized message")
        line, _, self._buf = self._buf.partition(b"\n")
        msg = decode(line)
        return msg.plan if isinstance(msg, PlanMsg) else None

    def _send(self, msg: Message) -> None:
        self._connected().sendall(encode_line(msg))

    def _connected(self) -> socket.socket:
        if self._sock is None:
            raise ConnectionError("not connected to the host agent: call connect() first")
        return self._sock
