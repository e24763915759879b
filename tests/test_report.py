"""The results writer (`benchmarks/report.py`): a benchmark's full output goes to its own file under
results/, its summary (key table + link) to a marked section of the RESULTS file; a rerun replaces
both in place. The committed RESULTS.md and results files link only to files and headings that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_links import LINK, broken_links

from benchmarks.report import anchor, pivot_table, results_file, write_result

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def marked(text: str, name: str) -> str:
    """The text of the marked section `name` (exactly one must exist)."""
    found = re.findall(rf"<!-- {re.escape(name)}:start -->\n(.*?)<!-- {re.escape(name)}:end -->", text, re.S)
    assert len(found) == 1, f"{len(found)} sections {name}"
    return found[0]


def summary_link(section: str, results: Path) -> Path:
    """The results file the summary section links to (its `Full output` line), resolved."""
    (target,) = re.findall(r"^- Full output: \[[^\]]*\]\(([^)]+)\)$", section, re.M)
    return (results.parent / target.partition("#")[0]).resolve()


def test_the_summary_goes_to_results_and_the_full_output_to_its_own_file(tmp_path):
    results = tmp_path / "RESULTS.md"
    body = "Run: 2 batches.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n\n### Targets\n\n- gap <= 2%: met"
    full = write_result("demo", "python benchmarks/demo.py --quick", body, "| a |\n|---|\n| 1 |", results)

    assert full == results_file("demo", results) == tmp_path / "results" / "demo.md"
    summary = marked(results.read_text(), "demo")
    assert summary.startswith("## demo\n\n- Command: `python benchmarks/demo.py --quick`\n- Machine: ")
    assert "| a |\n|---|\n| 1 |" in summary and "### Targets" not in summary and "| 3 | 4 |" not in summary
    assert summary_link(summary, results) == full.resolve() and broken_links(results) == []

    text = marked(full.read_text(), "demo")
    assert text.startswith("## demo\n\nCommand: `python benchmarks/demo.py --quick`\n\nMachine: ")
    assert re.search(r"\nLoad average: (\d+\.\d / ){2}\d+\.\d \(1, 5, 15 min\) when written\n", text)
    assert text.rstrip().endswith(body)
    assert full.read_text().startswith("# demo\n") and broken_links(full) == []  # its link back to RESULTS.md


def test_a_rerun_replaces_both_sections_in_place_and_keeps_the_text_around_them(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- first:start -->\nkept\n<!-- first:end -->\n")
    write_result("demo", "python demo.py", "old body", "old summary", results)
    with results.open("a") as handle:
        handle.write("\nFindings by hand, after the section.\n\n<!-- last:start -->\nkept too\n<!-- last:end -->\n")
    full = results_file("demo", results)
    full.write_text(full.read_text() + "\nFirst run's findings, by hand.\n")

    write_result("demo", "python demo.py --again", "new body", "new summary", results)
    text = results.read_text()
    assert marked(text, "demo").endswith("new summary\n") and "old summary" not in text
    assert "Command: `python demo.py --again`" in marked(text, "demo")
    positions = [text.index(mark) for mark in ("first:start", "demo:start", "Findings by hand", "last:start")]
    assert positions == sorted(positions)  # replaced where it was, nothing appended
    assert text.count("<!-- demo:start -->") == 1 and "kept\n" in text and "kept too" in text
    full_text = full.read_text()
    assert marked(full_text, "demo").endswith("new body\n") and "old body" not in full_text
    assert full_text.count("<!-- demo:start -->") == 1 and "First run's findings, by hand." in full_text


def test_a_recheck_goes_beside_its_run(tmp_path):
    results = tmp_path / "RESULTS.md"
    write_result("mutation-checker+auth", "python mutation.py", "survivors", "| score |", results)
    write_result("mutation-recheck-checker+auth", "python mutation.py --recheck", "rechecked", "- ok", results,
                 file="mutation-checker+auth")  # fmt: skip
    full = tmp_path / "results" / "mutation-checker+auth.md"
    assert sorted(path.name for path in (tmp_path / "results").iterdir()) == [full.name]
    assert marked(full.read_text(), "mutation-checker+auth").endswith("survivors\n")
    assert marked(full.read_text(), "mutation-recheck-checker+auth").endswith("rechecked\n")
    for name in ("mutation-checker+auth", "mutation-recheck-checker+auth"):
        assert summary_link(marked(results.read_text(), name), results) == full.resolve()
    assert broken_links(results) == []  # the anchors `#mutation-checkerauth`, `#mutation-recheck-checkerauth`


def test_pivot_table_one_row_per_key_one_column_per_value():
    headers = ["mix", "tokens", "method", "ms"]
    rows = [["long", 8, "loop", "1.0"], ["long", 8, "mask", "2.0"], ["short", 8, "loop", "3.0"]]
    assert pivot_table(headers, rows, ["mix", "tokens"], across="method", value="ms").splitlines() == [
        "| mix | tokens | loop ms | mask ms |",
        "|---|---|---|---|",
        "| long | 8 | 1.0 | 2.0 |",
        "| short | 8 | 3.0 | - |",
    ]


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("quality", "quality"),
        ("mutation-checker+auth", "mutation-checkerauth"),
        ("Headline figures", "headline-figures"),
        ("cost_model_accuracy", "cost_model_accuracy"),
        ("Why the survivors are equivalent (or killed since)", "why-the-survivors-are-equivalent-or-killed-since"),
    ],
)  # fmt: skip
def test_anchor_is_githubs(heading, expected):
    assert anchor(heading) == expected


def test_every_link_of_the_committed_results_resolves():
    """RESULTS.md and every results file link only to files (and headings) that exist: moving or
    renaming a results file breaks this test."""
    pages = [BENCHMARKS / "RESULTS.md", *sorted((BENCHMARKS / "results").glob("*.md"))]
    assert len(pages) > 1
    assert {page.name: broken_links(page) for page in pages} == {page.name: [] for page in pages}


def test_every_results_file_is_linked_from_results_md_and_each_summary_from_its_section():
    results = BENCHMARKS / "RESULTS.md"
    text = results.read_text()
    linked = {(results.parent / target.partition("#")[0]).resolve() for target in LINK.findall(text)}
    files = {path.resolve() for path in (BENCHMARKS / "results").glob("*.md")}
    assert files - linked == set()  # no results file a reader cannot reach
    names = re.findall(r"<!-- (\S+):start -->", text)
    assert len(names) == len(set(names)) >= 20
    for name in names:  # a script's summary links to the section of the same name in its results file
        target = summary_link(marked(text, name), results)
        assert target.parent == (BENCHMARKS / "results").resolve()
        assert marked(target.read_text(), name)
