"""`python -m bench.offload_calibration`: a mistake on its command line is one line and
exit 2, and never rewrites the stored calibration."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.offload_calibration import main
from shared.sim.offload_cost import CALIBRATION_FILE

RUN = str(Path(__file__).parents[2] / "docs" / "results" / "data" / "offload-h100" / "small.json")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "got none"),
        (["--predict", RUN], "expected two run files"),  # was read as two paths
        (["--predict", RUN, "missing.json"], "no such file: missing.json"),
        ([RUN, "--predict"], "expected two run files"),
        ([RUN, RUN, RUN], "expected two run files"),
    ],
)
def test_bad_command_lines_exit_2_with_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = CALIBRATION_FILE.read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert CALIBRATION_FILE.read_bytes() == before
