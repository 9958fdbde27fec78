"""The hypothesis profile tests/conftest.py loads: derandomised under CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _profile(ci: str) -> str:
    code = (
        "import tests.conftest\n"
        "from hypothesis import settings\n"
        "s = settings.default\n"
        "print(s.derandomize, s.database is None)\n"
    )
    env = {**os.environ, "CI": ci}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_ci_is_derandomised_and_dev_is_not() -> None:
    assert _profile("true") == "True True"
    assert _profile("") == "False False"
