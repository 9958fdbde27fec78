"""Helpers for tests that run commands and service processes: the borrower command the
reclaim tests publish, and stopping a set of processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def borrower_command(d: Path, name: str, ignores_term: bool, hold_s: float) -> list[str]:
    """A command that records each run in `d`/`name`.runs; its first run waits up to
    `hold_s` to be stopped, writing the time into `name`.term on SIGTERM (and exiting
    143, or going on when it ignores it); its second run finishes at once. Every run
    ends once `release_borrowers(d)` has been called: an agent stopped at a test's end
    leaves its jobs running (as it should), and the test must not."""
    on_term = "pass" if ignores_term else "sys.exit(143)"
    code = (
        "import os, signal, sys, time\n"
        f"d, name = {str(d)!r}, {name!r}\n"
        "open(f'{d}/{name}.runs', 'a').write(os.environ['CUDA_VISIBLE_DEVICES'] + '\\n')\n"
        "def term(*_):\n"
        "    open(f'{d}/{name}.term', 'a').write(f'{time.time()}\\n')\n"
        f"    {on_term}\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "if len(open(f'{d}/{name}.runs').read().splitlines()) == 1:\n"
        f"    for _ in range({round(hold_s * 10)}):\n"
        "        if os.path.exists(f'{d}/release'): break\n"
        "        time.sleep(0.1)\n"
    )
    return [sys.executable, "-c", code]


def release_borrowers(d: Path) -> None:
    """End every `borrower_command(d, ...)` process still holding (within 0.1 s)."""
    (d / "release").touch()


def stop_all(procs: Iterable[subprocess.Popen[bytes]], wait_s: float = 30.0) -> None:
    """SIGTERM every process still running, then wait for each; SIGKILL what does not
    end within `wait_s`."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
