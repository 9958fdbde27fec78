"""The host agent's settings from the environment: each mistake named in one error."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_agent.agent import AgentConfig
from shared.errors import UserError


def test_a_socket_path_longer_than_sun_path_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fits = "/tmp/" + "s" * (107 - len("/tmp/"))  # 107 bytes: the longest that binds
    monkeypatch.setenv("RLTUNE_OFFLOAD_SOCKET", fits)
    assert str(AgentConfig.from_env().socket_path) == fits
    monkeypatch.setenv("RLTUNE_OFFLOAD_SOCKET", fits + "s")
    with pytest.raises(UserError, match=r"RLTUNE_OFFLOAD_SOCKET=.* is 108 bytes"):
        AgentConfig.from_env()


@pytest.mark.parametrize("count", ["0", "four", "1025", "-2"])
def test_a_bad_gpu_count_is_refused(monkeypatch: pytest.MonkeyPatch, count: str) -> None:
    monkeypatch.setenv("RLTUNE_NODE_GPUS", count)
    with pytest.raises(UserError, match="RLTUNE_NODE_GPUS"):
        AgentConfig.from_env()
