"""The soak test (tests/integration/soak.py) at a small scale: mixed valid and hostile
messages on jobs.submit and offload.profiles, one broker restart, each service
SIGKILLed once mid-stream. docs/results/bus.md gives the figures of the full run."""

from __future__ import annotations

from pathlib import Path

from tests.integration.soak import Soak


async def test_soak_small(tmp_path: Path) -> None:
    soak = Soak(1200, restarts=1, seed=7, log_dir=tmp_path, kills=[["arrival", "profiler"]])
    report = await soak.run(progress=False)
    assert [e.killed for e in report.epochs] == ["arrival,profiler", ""]
    for e in report.epochs:
        assert e.answered_once == e.inputs == 600  # every input answered exactly once
        assert e.unanswered == e.answered_twice == e.accepted_twice == 0
        assert e.accepted > 0 and e.rejected > 0 and e.plans > 0 and e.dead_letters > 0
    # the kills came mid-stream: after answers had begun and before the second half of
    # the epoch was sent (a fast machine may have answered all of the first half by then)
    assert 0 < report.epochs[0].answered_at_kill <= 300
    both = {"arrival": True, "profiler": True}
    assert report.unready_while_broker_down == [both]  # /readyz 503 while it was down
    assert report.ready_after_restart == [both]  # and 200 again after
    assert report.outage_lines == {"arrival": 1, "profiler": 1}  # one line per outage
    assert report.tracebacks == {"arrival": 0, "profiler": 0}
    assert report.services_running_at_end == both
    assert report.clean_exit == {"arrival": 0, "profiler": 0}
    assert report.ok
