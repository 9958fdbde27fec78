"""A file of trace entries: each mistake named by file, entry and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import UserError
from shared.listfile import trace_entries

KEYS = {"trace", "format", "load"}


def entries(tmp_path: Path, text: str) -> list[tuple[str, dict[str, object]]]:
    f = tmp_path / "m.yaml"
    f.write_text(text)
    return list(trace_entries(f, "matrix", "cell", KEYS))


def test_entries_come_with_where_they_are(tmp_path: Path) -> None:
    got = entries(
        tmp_path, "- {trace: a.csv, format: alcf}\n- {trace: b.swf, format: swf, load: 0.8}\n"
    )
    assert [w.rsplit(", ", 1)[1] for w, _ in got] == ["cell 1", "cell 2"]
    assert got[1][1] == {"trace": "b.swf", "format": "swf", "load": 0.8}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[]\n", "expected a non-empty list of cells"),
        ("trace: a\n", "expected a non-empty list of cells"),
        ("- 3\n", "cell 1: expected a mapping"),
        (
            "- {trace: a, format: swf}\n- {trace: a, format: swf, lod: 1}\n",
            "cell 2: unknown key 'lod'",
        ),
        ("- {trace: a}\n", "cell 1: `format` is required"),
        ("- {trace: '', format: swf}\n", "cell 1: `trace` is required"),
        ("- [unclosed\n", "not YAML or JSON"),
    ],
)
def test_each_mistake_is_named(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(UserError, match=f"^matrix file .*{says}"):
        entries(tmp_path, text)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"matrix file not found: .*nope\.yaml"):
        list(trace_entries(tmp_path / "nope.yaml", "matrix", "cell", KEYS))
