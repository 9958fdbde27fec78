"""Readers never fail on garbage rows: every line is a job or a counted skip."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.traces import SkipStats
from shared.traces import philly as philly_mod
from shared.traces.registry import open_trace

GOOD_PHILLY = "2017-10-01 00:00:00,60.0,2,120.0,vc\n"
GOOD_RLTUNE = "a,10,0,5,1,-1,-1,-1,-1,-1,2,7,2,-1,0,-1,-1,3,4\n"
HEADERS = {
    "philly": "timestamp,duration,num_gpus,gpu_time,cluster\n",
    "helios": "job_id,user,vc,gpu_num,cpu_num,node_num,state,"
    "submit_time,start_time,end_time,duration,queue\n",
    "rltune": "",
    "jsonl": "",
}
GOOD = {
    "philly": GOOD_PHILLY,
    "helios": "j,u,v,1,1,1,COMPLETED,2020-04-01 00:00:00,,,60,0\n",
    "rltune": GOOD_RLTUNE,
    "jsonl": '{"job_id": "a", "num_gpus": 1, "duration_s": 5}\n',
}
junk_line = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters='\r\n\x00"'),
    max_size=60,
).filter(lambda s: s.strip() != "")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(GOOD)), st.lists(junk_line, max_size=8), st.integers(0, 3))
def test_garbage_is_skipped_and_counted(fmt: str, junk: list[str], good: int) -> None:
    rows = [GOOD[fmt].replace('"a"', f'"a{i}"') for i in range(good)]  # jsonl: one job an id
    body = HEADERS[fmt] + "".join(rows) + "".join(line + "\n" for line in junk)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "trace"
        p.write_text(body)
        stats = SkipStats()
        jobs = list(open_trace(p, fmt, None, stats))
    assert len(jobs) >= good  # the good rows all come through
    count_line = fmt == "rltune" and good == 0  # a lone first-line number is a count line
    if not count_line:
        assert len(jobs) + stats.total == good + len(junk)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_raw_json_is_the_same_whatever_the_chunk_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    jobs = [
        {"status": "Pass", "vc": "v", "jobid": f"app_{i}", "user": "u",
         "submitted_time": f"2017-10-07 13:0{i}:00",
         "attempts": [{"start_time": "2017-10-07 14:00:00",
                       "end_time": f"2017-10-07 14:00:0{i}",
                       "detail": [{"ip": "m", "gpus": ["gpu0"] * (i + 1)}]}]}
        for i in range(6)
    ]  # fmt: skip
    p = tmp_path / "log.json"
    p.write_text(json.dumps(jobs, indent=2))
    monkeypatch.setattr(philly_mod, "_CHUNK", chunk)
    stats = SkipStats()
    got = list(open_trace(p, "philly", None, stats))
    assert [(j.job_id, j.num_gpus, j.duration_s) for j in got] == [
        (f"app_{i}", i + 1, float(i)) for i in range(6)
    ]
    assert stats.total == 0
