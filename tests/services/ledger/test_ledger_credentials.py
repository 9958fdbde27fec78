"""The ledger's faust app logs in as every other service does: faust's own translation
of `credentials` into aiokafka's settings (what its consumer, producer and topic
client are built with) equals `KafkaSecurity.client_kwargs`, for each protocol."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from services.ledger.service import credentials
from shared.config import KafkaSecurity

CA = Path(ssl.get_default_verify_paths().cafile or "")


def _norm(kw: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in kw.items() if v is not None}
    out.setdefault("security_protocol", "PLAINTEXT")
    if "ssl_context" in out:
        assert isinstance(out["ssl_context"], ssl.SSLContext)
        out["ssl_context"] = "tls"
    return out


@pytest.mark.parametrize(
    "security",
    [
        KafkaSecurity(),
        KafkaSecurity("SSL"),
        KafkaSecurity("SASL_PLAINTEXT", "SCRAM-SHA-512", "rltune-ledger", "pw"),
        KafkaSecurity("SASL_PLAINTEXT", "SCRAM-SHA-256", "rltune-ledger", "pw"),
        KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "rltune-ledger", "pw"),
        KafkaSecurity("SASL_SSL", "PLAIN", "u", "p"),
    ],
    ids=lambda s: f"{s.protocol}-{s.mechanism}",
)
def test_faust_gets_the_services_login(security: KafkaSecurity) -> None:
    faust_kw = credentials_to_aiokafka_auth(credentials(security))
    assert _norm(faust_kw) == _norm(security.client_kwargs())


def test_sasl_ssl_hands_faust_the_clusters_ca() -> None:
    if not CA.is_file():
        pytest.skip("no system CA bundle here")
    sec = KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "rltune-ledger", "pw", str(CA))
    ctx = credentials_to_aiokafka_auth(credentials(sec))["ssl_context"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] > 0
