"""The planner benchmarks run end to end in smoke mode and write well-formed tables."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

from benchmarks import latency, quality
from benchmarks.common import geomean, median, percentile


def section_table(path: Path, name: str) -> tuple[list[str], list[list[str]], str]:
    """Headers, rows and the whole text of section `name` of a RESULTS file."""
    text = path.read_text()
    match = re.search(rf"<!-- {name}:start -->(.*?)<!-- {name}:end -->", text, re.S)
    assert match, f"no {name} section in {path}"
    section = match.group(1)
    lines = [line for line in section.splitlines() if line.startswith("|")]
    headers = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert set(lines[1].strip("|").split("|")) == {"---"}
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return headers, rows, section


def assert_numeric(row: list[str], headers: list[str], text_columns: set[str]) -> None:
    for header, cell in zip(headers, row, strict=True):
        if header in text_columns:
            continue
        value = float(cell)  # raises on "n/a" or any other text
        assert math.isfinite(value) and value >= 0, f"{header} = {cell}"


def test_statistics_helpers():
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5
    assert percentile(list(range(1, 21)), 95) == 19 and percentile([5.0], 95) == 5.0
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert math.isnan(median([])) and math.isnan(geomean([]))


def test_quality_quick_writes_its_section(tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    raw = tmp_path / "quality.json"
    argv = ["--quick", "--batches", "1", "--results", str(results), "--json", str(raw)]
    assert quality.main(argv) == 0

    headers, rows, section = section_table(results, "quality")
    assert headers == [
        "setting",
        "dataset",
        "batches",
        "sequences p50",
        "gap p50 %",
        "gap p95 %",
        "optimal %",
        "x megatron",
        "x wlb",
        "x flexsp",
        "x hydraulis",
        "min x hydraulis",
        "heterogeneous %",
        "latency p50 s",
        "latency p95 s",
    ]
    assert [row[:3] for row in rows] == [["8b-64xh100", "wikipedia", "1"], ["8b-64xh100", "lognormal", "1"]]
    for row in rows:
        assert_numeric(row, headers, {"setting", "dataset"})
        assert float(row[headers.index("gap p50 %")]) <= 100
    assert "Command: `python benchmarks/quality.py --quick" in section
    targets = section.split("### Targets", 1)[1]
    assert "Batches capped at" in targets
    for phrase in ("Median gap <= 2%", "Never worse than `hydraulis`", "over `megatron`", "latency p50 <= 1 s"):
        assert phrase in targets
    assert "Determinism at the defaults: see the `determinism` section" in targets
    assert re.search(r": (met|MISSED) \(", targets)

    records = json.loads(raw.read_text())
    assert len(records) == 2 and all(r["error"] is None for r in records)
    assert set(records[0]["baseline_step_time_s"]) == {"megatron", "wlb", "flexsp", "hydraulis"}
    assert "| setting | dataset |" in capsys.readouterr().out


def test_quality_baseline_subset_and_rewrite(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- other:start -->\nkept\n<!-- other:end -->\n")
    argv = ["--quick", "--batches", "1", "--datasets", "wikipedia", "--baselines", "megatron"]
    assert quality.main([*argv, "--results", str(results)]) == 0
    assert quality.main([*argv, "--results", str(results)]) == 0  # rewrites, does not append
    text = results.read_text()
    assert text.count("<!-- quality:start -->") == 1 and "kept" in text
    headers, rows, section = section_table(results, "quality")
    assert "x megatron" in headers and "x hydraulis" not in headers and len(rows) == 1
    assert "not measured (`hydraulis` not among --baselines)" in section


def test_latency_quick_writes_its_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    assert latency.main(["--quick", "--repeats", "1", "--results", str(results)]) == 0
    headers, rows, section = section_table(results, "latency")
    assert headers == latency.HEADERS
    assert [row[:2] for row in rows] == [["64xh100-1M", solver] for solver in ("greedy", "lp", "auto")]
    for row in rows:
        assert_numeric(row, headers, {"cluster", "solver"})
    targets = section.split("### Targets", 1)[1]
    assert "p50 <= 1 s for 64 GPUs / 1M tokens" in targets and "`auto` (the default solver)" in targets
    assert "1024 GPUs / 16M tokens: not measured" in targets


@pytest.mark.parametrize("module", [quality, latency])
def test_help_and_bad_names(module, capsys):
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert "--quick" in capsys.readouterr().out
    flag = "--settings" if module is quality else "--configs"
    with pytest.raises(SystemExit, match="unknown"):
        module.main([flag, "no-such-setting", "--no-write"])


def test_timeline_quick_writes_its_section(tmp_path):
    if os.environ.get("CI") != "true":  # the test extra installs matplotlib: CI must run this
        pytest.importorskip("matplotlib", reason="the plots extra (matplotlib) is not installed")
    from benchmarks import timeline

    results = tmp_path / "RESULTS.md"
    assert timeline.main(["--quick", "--repeats", "1", "--results", str(results)]) == 0
    headers, rows, section = section_table(results, "timeline")
    assert headers == ["setting", "strategy", "pipelines", "drawn", "format", "blocks", "median ms", "KiB"]
    assert [(row[3], row[4]) for row in rows] == [(d, f) for d in ("grouped", "all") for f in ("svg", "html", "png")]
    for row in rows:
        assert_numeric(row, headers, {"setting", "strategy", "drawn", "format"})
        assert int(row[5]) > 0
    assert "Command: `python" in section
