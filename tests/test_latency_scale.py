"""`benchmarks/latency.py --scale` runs end to end in smoke mode and writes its own section."""

from __future__ import annotations

import json
import math
import re

from benchmarks import latency
from benchmarks.report import results_file


def test_scale_quick_writes_its_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- latency:start -->\nkept\n<!-- latency:end -->\n")
    raw = tmp_path / "scale.json"
    assert latency.main(["--scale", "--quick", "--repeats", "1", "--results", str(results), "--json", str(raw)]) == 0
    text = results.read_text()
    assert "<!-- latency:start -->\nkept\n<!-- latency:end -->" in text  # the latency section is left alone
    section = re.search(r"<!-- latency_scale:start -->(.*?)<!-- latency_scale:end -->", text, re.S).group(1)
    lines = [line for line in section.splitlines() if line.startswith("|")]
    headers = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert headers == latency.SCALE_HEADERS
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert [row[:3] for row in rows] == [["64xh100-1M@0.1s", "auto", "1"]]
    for header, cell in zip(headers, rows[0], strict=True):
        if header not in ("cluster @ budget", "solver"):
            assert math.isfinite(float(cell)), f"{header} = {cell}"  # overruns may be negative
    assert "Command: `python benchmarks/latency.py --scale --quick" in section and "### Targets" not in section
    assert "(results/latency_scale.md#latency_scale)" in section
    full = results_file("latency_scale", results).read_text()
    assert "<!-- latency:start -->" not in full and lines[2] in full  # the same table, in full
    targets = full.split("### Targets", 1)[1]
    assert "Batches capped at" in targets and "4096 GPUs / 64M tokens: not measured" in targets
    (record,) = json.loads(raw.read_text())
    assert record["error"] is None and record["first_plan_s"] <= record["wall_s"] * 10
    assert record["first_status"] == "timeout_incumbent"


def test_scale_rows_are_named_like_the_targets():
    for row, _ in latency.SCALE_TARGETS:
        config, budget = latency.SCALE_ROWS[row]
        assert config in latency.SCALE_SETTINGS and row == f"{config}@{budget:g}s"
