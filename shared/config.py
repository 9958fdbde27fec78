"""Configuration: flags first, then environment, then defaults (DESIGN.md)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.errors import UserError
from shared.topics import Topics

__all__ = ["DEFAULT_BOOTSTRAP", "DEFAULT_PREFIX", "BusSettings", "KafkaSecurity"]

DEFAULT_BOOTSTRAP = "localhost:9092"
DEFAULT_PREFIX = "rltune."


PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """How this process authenticates to Kafka, as production clusters ask: each service
    is a principal of its own (SASL/SCRAM; a Strimzi `KafkaUser` in k8s) whose ACLs let
    it write only the topics it owns, over TLS where the cluster offers it.

    From the environment: `RLTUNE_KAFKA_SECURITY_PROTOCOL` (PLAINTEXT, SSL,
    SASL_PLAINTEXT, SASL_SSL; default PLAINTEXT, or SASL_PLAINTEXT when a user is set),
    `RLTUNE_KAFKA_SASL_MECHANISM` (SCRAM-SHA-512 by default, SCRAM-SHA-256, PLAIN),
    `RLTUNE_KAFKA_SASL_USERNAME`, `RLTUNE_KAFKA_SASL_PASSWORD` or
    `RLTUNE_KAFKA_SASL_PASSWORD_FILE` (a mounted secret), `RLTUNE_KAFKA_SSL_CAFILE`
    (the cluster's CA; the system's when absent)."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str = ""
    password: str = field(default="", repr=False)
    cafile: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KafkaSecurity:
        user = env.get("RLTUNE_KAFKA_SASL_USERNAME", "")
        protocol = env.get("RLTUNE_KAFKA_SECURITY_PROTOCOL", "").upper() or (
            "SASL_PLAINTEXT" if user else "PLAINTEXT"
        )
        mechanism = env.get("RLTUNE_KAFKA_SASL_MECHANISM", "").upper() or "SCRAM-SHA-512"
        password = env.get("RLTUNE_KAFKA_SASL_PASSWORD", "")
        secret = env.get("RLTUNE_KAFKA_SASL_PASSWORD_FILE", "")
        if secret:
            try:
                password = Path(secret).read_text().strip()
            except OSError as exc:
                raise UserError(
                    f"RLTUNE_KAFKA_SASL_PASSWORD_FILE={secret!r}: {exc.strerror}"
                ) from None
        out = cls(protocol, mechanism, user, password, env.get("RLTUNE_KAFKA_SSL_CAFILE", ""))
        out.check()
        return out

    def check(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise UserError(
                f"RLTUNE_KAFKA_SECURITY_PROTOCOL={self.protocol!r} must be one of "
                + ", ".join(PROTOCOLS)
            )
        if self.protocol.startswith("SASL"):
            if self.mechanism not in MECHANISMS:
                raise UserError(
                    f"RLTUNE_KAFKA_SASL_MECHANISM={self.mechanism!r} must be one of "
                    + ", ".join(MECHANISMS)
                )
            if not self.username or not self.password:
                raise UserError(
                    f"{self.protocol} needs RLTUNE_KAFKA_SASL_USERNAME and "
                    "RLTUNE_KAFKA_SASL_PASSWORD (or RLTUNE_KAFKA_SASL_PASSWORD_FILE)"
                )
        if self.cafile and not Path(self.cafile).is_file():
            raise UserError(f"RLTUNE_KAFKA_SSL_CAFILE={self.cafile!r} is not a file")

    def client_kwargs(self) -> dict[str, Any]:
        """What every aiokafka client (producer, consumer, admin) is built with."""
        if self.protocol == "PLAINTEXT":
            return {}
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.protocol.endswith("SSL"):
            out["ssl_context"] = ssl.create_default_context(cafile=self.cafile or None)
        if self.protocol.startswith("SASL"):
            out |= {
                "sasl_mechanism": self.mechanism,
                "sasl_plain_username": self.username,
                "sasl_plain_password": self.password,
            }
        return out


@dataclass(frozen=True, slots=True)
class BusSettings:
    """Where the Kafka cluster is, what the topics are called, and how to log in."""

    bootstrap: str = DEFAULT_BOOTSTRAP
    topic_prefix: str = DEFAULT_PREFIX
    security: KafkaSecurity = KafkaSecurity()

    def client_kwargs(self) -> dict[str, Any]:
        """The connection settings every aiokafka client of this process takes."""
        return {"bootstrap_servers": self.bootstrap, **self.security.client_kwargs()}

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
        return cls(bootstrap=b, topic_prefix=p, security=KafkaSecurity.from_env(env))


def _check_bootstrap(value: str) -> None:
    for hostport in value.split(","):
        host, sep, port = hostport.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(
                f"bootstrap server {hostport!r} must be HOST:PORT (comma-separated for several)"
            )
