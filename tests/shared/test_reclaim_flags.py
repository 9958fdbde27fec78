"""One definition of the preemption flags (shared/reclaim_flags.py) for scoring,
cluster-sim, `rltune simulate` and `rltune up`: the same defaults everywhere, help that
says which side a command is on (SIGTERM to real processes, or simulated), and the
bounds of each side, as one-line errors."""

from __future__ import annotations

import argparse
import re

import pytest

from rltune import main
from shared.errors import UserError
from shared.reclaim_flags import add_reclaim_args, check_reclaim_args


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # (argparse wraps lines)


@pytest.mark.parametrize(
    ("argv", "live", "simulated"),
    [
        (["service", "scoring"], True, False),
        (["service", "cluster-sim"], False, True),
        (["simulate"], False, True),
        (["up"], True, True),
    ],
)
def test_each_commands_help_says_what_its_flags_do(
    argv: list[str], live: bool, simulated: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(argv, capsys)
    assert "--grace S" in text and "--min-run S" in text
    assert ("SIGTERM, then SIGKILL after S seconds" in text) == live
    assert ("keeps its GPUs" in text) == simulated
    # restart cost and switching reclaim off are the simulator's (real jobs checkpoint
    # themselves; live reclaim is on wherever the cluster file has guarantees)
    assert ("--checkpoint S" in text) == simulated
    assert ("--no-reclaim" in text) == simulated
    assert "(default 120)" in text and "(default 600)" in text
    if simulated:
        assert "(default 1800; a priority class's checkpoint_s wins)" in text


def _parse(side: str, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_reclaim_args(p, side)  # type: ignore[arg-type]
    return p.parse_args(list(argv))


def test_defaults_and_bounds() -> None:
    a = _parse("sim")
    assert (a.grace, a.min_run, a.checkpoint, a.no_reclaim) == (120.0, 600.0, 1800.0, False)
    assert vars(_parse("live")) == {"grace": 120.0, "min_run": 600.0}
    # `up` tells what was given: unset by default
    u = _parse("both")
    assert (u.grace, u.min_run, u.checkpoint) == (None, None, None)
    check_reclaim_args(u, live=True)  # (nothing given: nothing to refuse)
    # live: a grace period travels in KillRequest.grace_s, at most a day
    check_reclaim_args(_parse("live", "--grace", "86400"), live=True)
    with pytest.raises(UserError, match=re.escape("--grace must be within [0, 86400] seconds")):
        check_reclaim_args(_parse("live", "--grace", "86401"), live=True)
    with pytest.raises(UserError, match="--min-run must be within"):
        check_reclaim_args(_parse("live", "--min-run", "-1"), live=True)
    # simulated: any finite time >= 0, a checkpoint interval > 0
    check_reclaim_args(_parse("sim", "--min-run", "1e6", "--grace", "0"), live=False)
    for flag, v in (("--grace", "nan"), ("--min-run", "inf"), ("--checkpoint", "0")):
        with pytest.raises(UserError, match=f"{flag} must be a number of seconds"):
            check_reclaim_args(_parse("sim", flag, v), live=False)
