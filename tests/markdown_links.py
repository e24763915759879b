"""Checking a markdown file's relative links (to files, folders and heading anchors), for the
tests of the docs (tests/test_docs.py) and of the benchmark reports (tests/test_report.py)."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.report import anchor

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def without_code_blocks(text: str) -> str:
    return FENCED.sub("", text)


def headings(path: Path) -> set[str]:
    """The anchors of every markdown heading of `path` (outside code blocks)."""
    text = without_code_blocks(path.read_text(encoding="utf-8"))
    return {anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def broken_links(path: Path, folders: bool = False) -> list[str]:
    """The relative links of markdown file `path` (outside code blocks) that do not resolve to a
    file of the tree (or a folder, with `folders`), or to a heading of the markdown file they name."""
    broken = []
    for target in LINK.findall(without_code_blocks(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not (linked.exists() if folders else linked.is_file()):
            broken.append(f"{target} (no file {linked})")
        elif fragment and linked.suffix == ".md" and fragment not in headings(linked):
            broken.append(f"{target} (no heading #{fragment} in {linked.name})")
    return broken
