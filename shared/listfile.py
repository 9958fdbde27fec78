"""Files that hold a list of trace entries (YAML or JSON): the evaluation matrix's
cells (`rltune eval --matrix`) and the trainer's worlds (`rltune train --world`).
Each entry is a mapping with at least `trace` and `format`; a malformed file is a
UserError that names the file, the entry and the key."""

from __future__ import annotations

from collections.abc import Iterator, Set
from pathlib import Path
from typing import Any

from shared.errors import UserError

__all__ = ["trace_entries"]


def trace_entries(
    path: str | Path, kind: str, entry: str, keys: Set[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each entry of the `kind` file at `path` (`kind` "matrix", `entry` "cell"), with
    where it is ("matrix file F, cell 2") for the caller's own errors: a non-empty
    list of mappings whose keys are all in `keys` and whose `trace` and `format` are
    non-empty strings."""
    import yaml

    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise UserError(f"{kind} file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {kind} file {p}: {exc}") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise UserError(f"{kind} file {p}: not YAML or JSON ({problem})") from None
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{kind} file {p}: expected a non-empty list of {entry}s")
    for i, c in enumerate(raw):
        where = f"{kind} file {p}, {entry} {i + 1}"
        if not isinstance(c, dict):
            raise UserError(f"{where}: expected a mapping of trace, format, cluster, ...")
        unknown = sorted(set(map(str, c)) - set(keys))
        if unknown:
            raise UserError(
                f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(keys))}"
            )
        for key in ("trace", "format"):
            if not isinstance(c.get(key), str) or not c[key]:
                raise UserError(f"{where}: `{key}` is required (a string)")
        yield where, c
