"""The analytic model's peak memory against published peaks (issue 31, item 4): rows frozen with
their source, groups never pooled, and the +-15% target on the rows whose recipe the model states."""

from __future__ import annotations

import pytest

from benchmarks.published_memory import BAND, FROZEN, ROWS, predicted_gib, rows_and_summary
from hydraplan.cost_models.analytic import AnalyticOptions, rank_memory_terms, scheme_memory
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.scheme import ParallelScheme

EXPRESSIBLE = [run for run in ROWS if run.group == "expressible"]


def test_rows_are_frozen_with_their_source_and_first_ratio() -> None:
    assert FROZEN == "2026-12-02"
    assert {run.group for run in ROWS} == {"expressible", "approximate"} and len(EXPRESSIBLE) >= 2
    for run in ROWS:
        assert run.source.startswith("https://github.com/pytorch/torchtitan/blob/") and run.first_ratio > 0


def test_the_summary_never_pools_the_groups() -> None:
    rows, summary = rows_and_summary()
    assert len(rows) == len(ROWS)
    assert {line[0]: int(line[1]) for line in summary} == {
        "expressible": len(EXPRESSIBLE),
        "approximate": len(ROWS) - len(EXPRESSIBLE),
    }


def test_the_rank_terms_give_the_capacity_scheme_memory_reports() -> None:
    model, gpu, scheme = get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), ParallelScheme(2, 4, 1)
    options = AnalyticOptions(min_capacity_tokens=1)
    memory = scheme_memory(model, gpu, scheme, 64, options)
    usable = gpu.memory_bytes * (1 - options.memory_reserve_fraction)
    ranks = rank_memory_terms(model, scheme, 64, options)
    assert max(rank.peak_bytes([memory.capacity_tokens]) for rank in ranks) <= usable
    assert max(rank.peak_bytes([memory.capacity_tokens + 1]) for rank in ranks) > usable


@pytest.mark.xfail(
    strict=True,
    reason="issue 31 item 4 not met: the analytic peak is 0.62-0.70 of torchtitan's published (reserved) "
    "peak on the expressible rows (benchmarks/results/published_memory.md); strict, so a fix is noticed",
)
@pytest.mark.parametrize("run", EXPRESSIBLE, ids=lambda run: run.name)
def test_the_predicted_peak_is_within_fifteen_percent_of_the_published_one(run) -> None:
    assert abs(predicted_gib(run) / run.published_gib - 1) <= BAND
