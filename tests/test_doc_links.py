"""Every relative link in README.md and every Markdown file under docs/ reaches a file of
the checkout, and every `#anchor` a heading of the file it names (GitHub's heading ids,
which mkdocs.yml gives the site's headings too). Sections move between README and docs/;
a link left pointing at the old place fails here. (`make lint` also builds the site with
`mkdocs build --strict`, which checks the pages' links again the site's way.)"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, markup and punctuation other than `-`
    and `_` dropped, spaces to `-`."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_code = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = re.match(r"^#{1,6} (.*)$", line)
        if in_code or not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    in_code = False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            out += [(no, m.group(1)) for m in LINK.finditer(line)]
    return out


def test_slug_matches_githubs_ids_on_headings_of_this_readme() -> None:
    """Ids GitHub gives (checked by hand on rendered headings of this shape)."""
    assert slug("Results: 30% of Philly jobs offloading") == "results-30-of-philly-jobs-offloading"
    assert slug("On a GPU: NVIDIA H100 (`--device cuda`)") == "on-a-gpu-nvidia-h100---device-cuda"
    assert slug("Why a job waits: `rltune why JOB_ID`") == "why-a-job-waits-rltune-why-job_id"
    assert slug("`rltune bench packing`: the ATC'23 packing experiment") == (
        "rltune-bench-packing-the-atc23-packing-experiment"
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(doc: Path) -> None:
    broken = []
    for no, target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{doc.relative_to(ROOT)}:{no}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(
                f"{doc.relative_to(ROOT)}:{no}: {target} (no such heading in {dest.name})"
            )
    assert not broken, "\n".join(broken)


def test_readme_is_a_front_page() -> None:
    """At most 300 lines; its first screen (60 lines) names the submit topic and holds a
    JobSpec (guides, design and results live in docs/)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"
    first = "\n".join(lines[:60])
    assert "rltune.jobs.submit" in first
    assert '"job_id": "train-42"' in first and '"num_gpus": 4' in first
