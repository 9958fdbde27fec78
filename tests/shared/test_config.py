"""Kafka credentials from the environment: what every aiokafka client is built with,
and one clear error per mistake (a user's mistake at the command line is one line)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from shared.config import BusSettings, KafkaSecurity
from shared.errors import UserError


def test_plaintext_by_default_adds_nothing() -> None:
    s = BusSettings.resolve(env={})
    assert s.client_kwargs() == {"bootstrap_servers": "localhost:9092"}


def test_a_user_means_sasl_scram(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    env = {
        "RLTUNE_KAFKA_SASL_USERNAME": "rltune-scoring",
        "RLTUNE_KAFKA_SASL_PASSWORD_FILE": str(secret),
    }
    kw = BusSettings.resolve("k:9093", env=env).client_kwargs()
    assert kw == {
        "bootstrap_servers": "k:9093",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "rltune-scoring",
        "sasl_plain_password": "s3cret",
    }
    assert "s3cret" not in repr(BusSettings.resolve(env=env))


def test_sasl_ssl_carries_a_tls_context() -> None:
    env = {
        "RLTUNE_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "RLTUNE_KAFKA_SASL_USERNAME": "u",
        "RLTUNE_KAFKA_SASL_PASSWORD": "p",
    }
    kw = KafkaSecurity.from_env(env).client_kwargs()
    assert kw["security_protocol"] == "SASL_SSL"
    assert isinstance(kw["ssl_context"], ssl.SSLContext)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RLTUNE_KAFKA_SECURITY_PROTOCOL": "TLS"}, "must be one of PLAINTEXT"),
        ({"RLTUNE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs RLTUNE_KAFKA_SASL_USERNAME"),
        ({"RLTUNE_KAFKA_SASL_USERNAME": "u"}, "needs RLTUNE_KAFKA_SASL_USERNAME"),
        (
            {
                "RLTUNE_KAFKA_SASL_USERNAME": "u",
                "RLTUNE_KAFKA_SASL_PASSWORD": "p",
                "RLTUNE_KAFKA_SASL_MECHANISM": "GSSAPI",
            },
            "SCRAM-SHA-512",
        ),
        ({"RLTUNE_KAFKA_SASL_PASSWORD_FILE": "/no/such/file"}, "No such file"),
        ({"RLTUNE_KAFKA_SSL_CAFILE": "/no/such/ca.crt"}, "is not a file"),
    ],
)
def test_mistakes_are_one_clear_line(env: dict[str, str], says: str) -> None:
    with pytest.raises(UserError, match=says) as err:
        BusSettings.resolve(env=env)
    assert "\n" not in str(err.value)
