"""The two lock files against pyproject.toml and what is installed: requirements.lock
pins exactly the run-time closure of `dependencies` (what the image installs),
requirements-dev.lock exactly what the `dev` extra adds on top, and every pin is the
version installed here (`make install` installs from them, so a drift means a lock
edited by hand or a range in pyproject.toml that no longer admits the pin).

The closure is recomputed from the installed distributions' own metadata
(`importlib.metadata`, markers evaluated by `packaging`), not read back from the
locks."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# installed by pip/venv themselves (make install asks setuptools>=77), never pinned
UNPINNED = {"pip", "setuptools", "wheel"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{path.name}: {line!r} is not an exact pin"
        assert _norm(name) not in out, f"{path.name}: {name} pinned twice"
        out[_norm(name)] = version
    return out


def _closure(specs: list[str]) -> set[str]:
    seen: set[str] = set()
    stack = [Requirement(s) for s in specs]
    while stack:
        req = stack.pop()
        name = _norm(req.name)
        if name in seen or name in UNPINNED:
            continue
        seen.add(name)
        for spec in distribution(req.name).requires or []:
            dep = Requirement(spec)
            extras = ("", *req.extras)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras):
                stack.append(dep)
    return seen


@pytest.fixture(scope="module")
def project() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        p = tomllib.load(f)["project"]
    return {"run": p["dependencies"], "dev": p["optional-dependencies"]["dev"]}


def test_requirements_lock_is_exactly_the_run_time_closure(project: dict[str, list[str]]) -> None:
    run = _closure(project["run"])
    pinned = set(_pins(ROOT / "requirements.lock"))
    assert sorted(run - pinned) == [], "run-time dependencies missing from requirements.lock"
    assert sorted(pinned - run) == [], "requirements.lock pins what the project does not need"


def test_dev_lock_is_exactly_what_the_dev_extra_adds(project: dict[str, list[str]]) -> None:
    run, dev = _closure(project["run"]), _closure(project["dev"])
    pinned = set(_pins(ROOT / "requirements-dev.lock"))
    assert sorted((dev - run) - pinned) == [], "dev tools missing from requirements-dev.lock"
    assert sorted(pinned - (dev - run)) == [], "requirements-dev.lock pins what it should not"


def test_every_pin_is_the_installed_version() -> None:
    for lock in ("requirements.lock", "requirements-dev.lock"):
        for name, version in _pins(ROOT / lock).items():
            try:
                got = distribution(name).version
            except PackageNotFoundError:  # pragma: no cover - a failing install
                pytest.fail(f"{lock}: {name} is pinned but not installed")
            # torch's local build tag (+cpu / +cuXXX) is the index's, not the release's
            assert got.split("+")[0] == version, f"{lock}: {name}=={version}, installed {got}"
