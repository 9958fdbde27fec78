"""`rltune bench encoder_ab`: against this checkout's own encoder (HEAD) the features
are the same numbers and both rank the window alike (the bench asserts it); a
revision git does not know is one line."""

from __future__ import annotations

import pytest

from bench.encoder_ab import main
from shared.errors import UserError


def test_against_head_the_features_are_equal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--before", "HEAD", "--repeat", "3", "--window", "32"]) == 0
    out = capsys.readouterr().out
    diff = float(out.split("largest feature difference ")[1].split()[0])
    assert diff < 1e-9  # the same encoder (0 once the checkout is committed)
    assert "before (HEAD): CPU p50" in out and "after  (this checkout): CPU p50" in out


def test_unknown_revision_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^--before no-such-rev: "):
        main(["--before", "no-such-rev", "--repeat", "1"])
