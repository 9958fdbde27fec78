"""Where the tests find the real traces and the independent checker: the
project's shared folder beside the checkout (`../shared`). `conftest.py` stops
the session with one clear line when it is missing, so no test that needs a
real trace is ever skipped in silence."""

from __future__ import annotations

from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = SHARED / "traces"
TOOLS = SHARED / "tools"
PHILLY = TRACES / "philly" / "philly-sep-oct.csv"
RLTUNE_TRACE = TRACES / "rltune" / "synthetic_trace.csv"
ALIBABA_2023 = TRACES / "alibaba-2023"
GAVEL = TRACES / "gavel" / "throughputs.json"

REQUIRED = (PHILLY, RLTUNE_TRACE, ALIBABA_2023, GAVEL, TOOLS / "check_jobs.py")
THETAGPU = TRACES / "alcf" / "thetagpu-2023-jan-apr.csv"
KTH_SWF = TRACES / "swf" / "KTH-SP2-1996-unfiltered.swf"
LLNL_SWF = TRACES / "swf" / "LLNL-Atlas-2006-2.1-cln.swf"
ITP = TRACES / "itp"
