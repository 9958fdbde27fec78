"""Configuration: flags first, then environment, then defaults (DESIGN.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from shared.errors import UserError
from shared.topics import Topics

__all__ = ["DEFAULT_BOOTSTRAP", "DEFAULT_PREFIX", "BusSettings"]

DEFAULT_BOOTSTRAP = "localhost:9092"
DEFAULT_PREFIX = "rltune."


@dataclass(frozen=True, slots=True)
class BusSettings:
    """Where the Kafka cluster is and what the topics are called."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    topic_prefix: str = DEFAULT_PREFIX

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)

    @classmethod
    def resolve(
        cls,
        bootstrap: str | None = None,
        topic_prefix: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> BusSettings:
        """Flag value if given, else `RLTUNE_BOOTSTRAP_SERVERS` / `RLTUNE_TOPIC_PREFIX`,
        else the defaults."""
        env = os.environ if env is None else env
        b = bootstrap or env.get("RLTUNE_BOOTSTRAP_SERVERS") or DEFAULT_BOOTSTRAP
        p = topic_prefix if topic_prefix is not None else env.get("RLTUNE_TOPIC_PREFIX")
        p = DEFAULT_PREFIX if p is None else p
        _check_bootstrap(b)
        if any(c.isspace() for c in p) or len(p) > 100:
            raise UserError(f"topic prefix {p!r} must be at most 100 characters with no spaces")
        return cls(bootstrap=b, topic_prefix=p)


def _check_bootstrap(value: str) -> None:
    for hostport in value.split(","):
        host, sep, port = hostport.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(
                f"bootstrap server {hostport!r} must be HOST:PORT (comma-separated for several)"
            )
