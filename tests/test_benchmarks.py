"""The planner benchmarks run end to end in smoke mode and write well-formed tables: the key table
to their section of the RESULTS file, everything to their results file."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import time
from pathlib import Path

import pytest

from benchmarks import latency, quality
from benchmarks.common import geomean, median, percentile
from benchmarks.report import results_file
from hydraplan.planner.strategies import parse_strategy

INTERLEAVED = ("megatron-vpp", "wlb-vpp")


def section_text(path: Path, name: str) -> str:
    """The whole text of section `name` of a RESULTS file or a results file."""
    match = re.search(rf"<!-- {name}:start -->(.*?)<!-- {name}:end -->", path.read_text(), re.S)
    assert match, f"no {name} section in {path}"
    return match.group(1)


def section_table(path: Path, name: str) -> tuple[list[str], list[list[str]], str]:
    """Headers, rows (of its first table) and the whole text of section `name`."""
    section = section_text(path, name)
    all_lines = section.splitlines()
    start = next(index for index, line in enumerate(all_lines) if line.startswith("|"))
    lines = list(itertools.takewhile(lambda line: line.startswith("|"), all_lines[start:]))
    headers = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert set(lines[1].strip("|").split("|")) == {"---"}
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return headers, rows, section


def full_output(path: Path, name: str) -> str:
    """The section `name` of the results file that the summary section `name` of `path` links to."""
    link = f"[results/{name}.md](results/{name}.md#{name})"
    assert f"- Full output: {link}" in section_text(path, name)
    return section_text(results_file(name, path), name)


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
        "x megatron-vpp",
        "x wlb-vpp",
        "min x hydraulis",
        "heterogeneous %",
        "behind a baseline",
        "cut by clock %",
        "CPU p50 s",
        "latency p50 s",
        "latency p95 s",
    ]
    assert [row[:3] for row in rows] == [["8b-64xh100", "wikipedia", "1"], ["8b-64xh100", "lognormal", "1"]]
    for row in rows:
        assert_numeric(row, headers, {"setting", "dataset"})
        assert float(row[headers.index("gap p50 %")]) <= 100
    assert "Command: `python benchmarks/quality.py --quick" in section and "### Targets" not in section
    full = full_output(results, "quality")
    assert "Command: `python benchmarks/quality.py --quick" in full
    assert section_table(results_file("quality", results), "quality")[:2] == (headers, rows)  # the same table
    targets = full.split("### Targets", 1)[1]
    assert "Batches capped at" in targets
    for phrase in ("Median gap <= 2%", "Never worse than `hydraulis`", "over `megatron`", "latency p50 <= 1 s"):
        assert phrase in targets
    # never behind a peer (planner.portfolio): every quick batch is at least every baseline
    assert all(row[headers.index("behind a baseline")] == "0" for row in rows)
    assert "Batches behind a baseline (its own plan of the same batch faster): 0 of 2: met." in targets
    assert "Determinism at the defaults: see the `determinism` section" in targets
    assert re.search(r": (met|MISSED) \(", targets)

    records = json.loads(raw.read_text())
    assert len(records) == 2 and all(r["error"] is None for r in records)
    assert set(records[0]["baseline_step_time_s"]) == {"megatron", "wlb", "flexsp", "hydraulis", *INTERLEAVED}
    # the interleaved baselines ran their recipe (Llama 3 8B: v 4 at pp 2, 2 at pp 4) where they pipeline
    for name in INTERLEAVED:
        strategy = records[0]["baseline_strategy"][name]
        assert all(scheme.pp == 1 or scheme.v == {2: 4, 4: 2}[scheme.pp] for scheme in parse_strategy(strategy).schemes)
    section = full.split("### Plain and interleaved baselines", 1)[1].split("###", 1)[0]
    assert "| x megatron | x megatron-vpp | x wlb | x wlb-vpp | fastest plain baseline | fastest baseline |" in section
    summary = section_text(results, "quality")
    assert summary.count("interleaving changes the fastest baseline on ") == 2  # one line per row, in RESULTS too
    assert re.search(r"x megatron [\d.]+ -> x megatron-vpp [\d.]+, x wlb [\d.]+ -> x wlb-vpp [\d.]+\.", summary)
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
    assert "x megatron-vpp" not in headers and "Plain and interleaved baselines" not in full_output(results, "quality")
    assert "not measured (`hydraulis` not among --baselines)" in full_output(results, "quality")
    assert [path.name for path in (tmp_path / "results").iterdir()] == ["quality.md"]


def test_latency_quick_writes_its_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    assert latency.main(["--quick", "--repeats", "1", "--results", str(results)]) == 0
    headers, rows, section = section_table(results, "latency")
    assert headers == latency.HEADERS
    assert [row[:2] for row in rows] == [["64xh100-1M", solver] for solver in ("greedy", "lp", "auto")]
    for row in rows:
        assert_numeric(row, headers, {"cluster", "solver"})
    targets = full_output(results, "latency").split("### Targets", 1)[1]
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
    headers, rows, section = section_table(results_file("timeline", results), "timeline")
    assert headers == ["setting", "strategy", "pipelines", "drawn", "format", "blocks", "median ms", "KiB"]
    assert [(row[3], row[4]) for row in rows] == [(d, f) for d in ("grouped", "all") for f in ("svg", "html", "png")]
    for row in rows:
        assert_numeric(row, headers, {"setting", "strategy", "drawn", "format"})
        assert int(row[5]) > 0
    assert "Command: `python" in section and full_output(results, "timeline") == section
    # the summary: one row per drawing, a time column per format
    headers, summary_rows, _ = section_table(results, "timeline")
    formats = [f"{kind} median ms" for kind in ("svg", "html", "png")]
    assert headers == ["setting", "strategy", "pipelines", "drawn", "blocks", *formats]
    assert [row[3] for row in summary_rows] == ["grouped", "all"]
    assert [row[5:] for row in summary_rows] == [[row[6] for row in rows[i : i + 3]] for i in (0, 3)]


def test_published_writes_its_summary_and_its_full_output(tmp_path):
    from benchmarks import published

    results = tmp_path / "RESULTS.md"
    assert published.main(["--results", str(results)]) == 0
    summary = section_text(results, "published")
    lines = summary.rstrip().split("\n\n")[-1].splitlines()  # after the command, machine and link
    assert [line.split(":", 1)[0] for line in lines] == [
        "- In-sample rows (the A100 entry was fitted on these)",
        "- Held-out rows",
        "- All rows",
    ]
    assert all("median ratio" in line and "within +-30%" in line for line in lines)
    full = full_output(results, "published")
    assert "| run | GPUs |" not in summary and full.count("| run | GPUs |") == 2
    assert "Interleaving sensitivity" in full and "Provenance of the held-out rows" in full


def test_the_mutation_summary_is_the_scores_and_the_survivors_stay_in_the_full_output():
    from benchmarks import mutation

    counts = {"killed": 3, "survived": 1, "pending": 0}
    results = {"checker": {"counts": counts, "elapsed_s": 120.0, "survivors": [(69, "core/NumberReplacer", "x = 1")]}}
    summary = mutation.score_table(results)
    assert summary.splitlines()[2] == "| checker | planner/check.py | 4 | 3 | 1 | 75.0% | 0 | 2 min |"
    full = mutation.report(results)
    assert summary in full and "### Surviving mutants: checker" in full and "| 69 | NumberReplacer | `x = 1` |" in full
    rows = [
        (69, "core/NumberReplacer", "x = 1", "survived", "killed"),
        (70, "core/AddNot", "y", "timed out", "survives"),
    ]
    line = mutation.recheck_line("checker", {"rows": rows, "elapsed_s": 540.0})
    assert line == "checker: 1 of 1 survivors killed now; 0 of 1 timed-out mutants fail or time out again (9 min)"
    assert f"### {line}" in mutation.recheck_report({"checker": {"rows": rows, "elapsed_s": 540.0}})
    sampled = {"killed": 50, "survived": 50, "pending": 0, "not sampled": 900}
    row = mutation.score_table({"checker": {"counts": sampled, "elapsed_s": None, "survivors": []}}).splitlines()[2]
    assert "| 50.0% (95%: 40.4-59.6%; a sample: 900 not sampled) |" in row  # Wilson's interval at 50 of 100
    low, high = mutation.wilson_interval(0, 20)
    assert low == 0.0 and high == pytest.approx(0.1611, abs=1e-4)


def test_the_api_load_summary_takes_the_row_of_all_kinds():
    from benchmarks import api_load

    samples = [
        api_load.Sample("plan64", 200, 0.5),
        api_load.Sample("plan64", 503, 0.1),
        api_load.Sample("models", 200, 0.1),
    ]
    text, summary, total = api_load.load_table(samples, elapsed_s=2.0)
    assert total[:6] == ["all", 3, 2, 1, 0, 0] and total[6] == "1.0"
    assert total[9] == "100.0"  # the cost of a 503: its p50 latency
    assert summary["plan64"]["ok_per_s"] == 0.5 and text.splitlines()[0].startswith("| kind | requests |")


def test_search_profile_times_each_phase_and_restores_the_planner():
    """benchmarks/search_profile.py: the phases of a real solve are timed (CPU seconds, each at
    most the whole call) and the planner's functions are the originals again afterwards."""
    from synthetic import synthetic_profile, wikipedia_like_batch

    from benchmarks import search_profile
    from hydraplan.planner import search as search_module
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import solve

    before = search_module.Frontier.expand_next
    totals: dict[str, float] = {}
    request = PlanRequest(lengths=wikipedia_like_batch(100_000, seed=2), num_gpus=16, options=SolverOptions())
    with search_profile.timed_phases(totals):
        started = time.process_time()
        solve(request, synthetic_profile(max_gpus=16))
        whole = time.process_time() - started
    assert search_module.Frontier.expand_next is before
    assert {"strategy solves (dispatch + packing)", "independent check", "baselines' plans (portfolio)"} <= set(totals)
    assert all(0 <= value <= whole + 1e-3 for value in totals.values())
    table, body = search_profile.report({"tiny": (totals | {"solve": whole}, [("f", 0.1)], "plan")})
    assert table.splitlines()[0] == "| CPU s (clock standing still) | tiny |" and "### Most self time, tiny" in body


def test_search_profile_variants_set_and_restore_the_search_settings():
    """benchmarks/search_profile.py --to-final: "before" turns probes off (the search's order
    before them), the slow-machine variant polishes ahead from the first probe; both restore the
    search module's settings."""
    from benchmarks import search_profile
    from hydraplan.planner import search as search_module

    probe_every, share = search_module.PROBE_EVERY, search_module.EARLY_POLISH_AFTER_SHARE
    assert probe_every > 0
    with search_profile.variant("before"):
        assert search_module.PROBE_EVERY == 0
    with search_profile.variant(search_profile.SLOW):
        assert search_module.PROBE_EVERY == probe_every and search_module.EARLY_POLISH_AFTER_SHARE < 0
    with search_profile.variant("after"):
        assert (search_module.PROBE_EVERY, search_module.EARLY_POLISH_AFTER_SHARE) == (probe_every, share)
    assert (search_module.PROBE_EVERY, search_module.EARLY_POLISH_AFTER_SHARE) == (probe_every, share)
