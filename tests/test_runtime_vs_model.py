"""The runtime-vs-model benchmark's tables on synthetic results (no torch launch), and the
gradient-sync pricing of a profiled profile that the benchmark's predictions depend on."""

from __future__ import annotations

import pytest

from benchmarks import runtime_vs_model as bench
from hydraplan.cost_models.catalog import get_model
from hydraplan.cost_models.fit import build_profiled_profile
from hydraplan.cost_models.profile_io import bundled_profile
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.scheme import ParallelScheme


def _result(batch, name, predicted, measured, strategy=None, overhead=0.02, runtime_overhead=0.01) -> bench.RunResult:
    return bench.RunResult(
        batch=batch,
        name=name,
        strategy=strategy or ("1x<1,1,2> + 2x<1,1,1>" if name == "hydraplan" else "2x<2,1,1>"),
        num_tokens=4000,
        predicted_step_s=predicted,
        predicted_pipeline_s=predicted - 0.02,
        predicted_sync_s=0.02,
        measured_step_s=measured,
        measured_pipeline_s=measured - 0.03,
        measured_sync_s=0.03,
        optimizer_s=0.01,
        overhead=overhead,
        runtime_overhead=runtime_overhead,
    )


def test_the_error_is_signed_per_run_and_its_median_absolute() -> None:
    results = [_result(0, "hydraplan", 0.9, 1.0), _result(0, "megatron", 1.3, 1.0), _result(1, "hydraplan", 1.0, 1.0)]
    assert results[0].error == pytest.approx(-0.1) and results[1].error == pytest.approx(0.3)
    assert bench.median_error(results) == pytest.approx(0.1)
    rows = bench.run_rows(results)
    assert len(rows) == 3 and len(rows[0]) == len(bench.RUN_HEADERS)
    assert rows[0][5] == "-10.0%" and rows[1][5] == "+30.0%"


def test_winners_agree_differ_within_the_error_or_disagree() -> None:
    results = [
        # batch 0: predicted and measured both say hydraplan
        _result(0, "hydraplan", 0.7, 0.8),
        _result(0, "megatron", 1.0, 1.1),
        # batch 1: predicted hydraplan, measured megatron by 5%: within an error of 10%
        _result(1, "hydraplan", 0.7, 1.05),
        _result(1, "megatron", 0.8, 1.0),
        # batch 2: predicted hydraplan, measured megatron by 50%: a miss
        _result(2, "hydraplan", 0.7, 1.5),
        _result(2, "megatron", 0.8, 1.0),
        # batch 3: both planners chose the same plan
        _result(3, "hydraplan", 0.9, 1.0, strategy="4x<1,1,1>"),
        _result(3, "megatron", 0.9, 1.02, strategy="4x<1,1,1>"),
    ]
    rows, misses = bench.winner_rows(results, error=0.10)
    assert [row[-1] for row in rows] == ["agree", "differ, within the error", "DISAGREE", "same plan"]
    assert rows[2][1:4] == ["hydraplan", "14.3%", "megatron"]
    assert misses == ["batch 2: predicted hydraplan, measured megatron (50.0%)"]
    lines = bench.target_lines(results, misses)
    assert "NOT met: batch 2" in lines[1]


def test_the_targets_read_the_figures() -> None:
    good = [_result(0, "hydraplan", 1.0, 1.05, overhead=0.12, runtime_overhead=0.04), _result(0, "megatron", 1.2, 1.25)]
    lines = bench.target_lines(good, [])
    assert "(met, target <= 15%)" in lines[0] and lines[1].endswith("met")
    assert "worst 4.0% (met" in lines[2] and "worst 12.0% (over 10%)" in lines[3]
    bad = [_result(0, "hydraplan", 1.0, 1.5, overhead=0.3, runtime_overhead=0.2), _result(0, "megatron", 1.0, 1.6)]
    lines = bench.target_lines(bad, [])
    assert "NOT met, target <= 15%" in lines[0] and "worst 20.0% (NOT met" in lines[2]


def test_the_term_table_splits_each_schemes_measured_stage_time() -> None:
    result = _result(0, "hydraplan", 1.0, 1.0)
    result.samples = [
        bench.StageSample("<1,1,2>", predicted_s=1.0, model_s=0.6, bookkeeping_s=0.0, collectives_s=0.2, fwd_s=0.3),
        bench.StageSample("<1,1,2>", predicted_s=1.0, model_s=0.9, bookkeeping_s=0.1, collectives_s=0.2, fwd_s=0.4),
        bench.StageSample("<1,1,1>", predicted_s=0.5, model_s=0.5, bookkeeping_s=0.0, collectives_s=0.0, fwd_s=0.2),
    ]
    rows = {row[0]: row for row in bench.term_rows([result])}
    assert rows["<1,1,2>"][1:4] == [2, "1.000", "20.8%"]  # ratios 0.8 and 1.2; errors 25% and 16.7%
    assert rows["<1,1,2>"][4:7] == ["75.0%", "5.0%", "20.0%"]
    assert rows["<1,1,1>"][2] == "1.000" and rows["<1,1,1>"][6] == "0.0%"
    body = bench.report_body([result, _result(0, "megatron", 1.2, 1.3)], ["preamble"])
    assert body.startswith("preamble") and "### Targets" in body


def test_the_benchmark_profile_derives_capacities_from_the_pretend_memory() -> None:
    profile = bench.benchmark_profile(bundled_profile("tiny-cpu"), 150e6)
    cost = ProfileCostModel(profile)
    capacities = {scheme: cost.capacity_tokens(scheme) for scheme in cost.schemes()}
    assert 500 < capacities[ParallelScheme(1, 1, 1)] < capacities[ParallelScheme(2, 1, 1)] < 2000
    lengths = bench.batch_lengths(3, 4000)
    assert sum(lengths) >= 4000 and max(lengths) <= 1150 and lengths == bench.batch_lengths(3, 4000)


def test_a_profiled_profile_prices_the_gradient_sync() -> None:
    """`grad_bytes_per_gpu` was 0 in every profiled profile, so the measured all-reduce bandwidth
    priced no gradient sync at all; it is the stage's gradient shard at the measured dtype."""
    bundled = bundled_profile("tiny-cpu")
    model = get_model("tiny")
    rebuilt = build_profiled_profile(
        bundled.provenance, model="tiny", device_name="cpu", num_layers=4, memory_bytes=None, model_spec=model
    )
    shard = {entry.key: entry.grad_bytes_per_gpu for entry in rebuilt.schemes}
    assert shard[(1, 1, 1)] == pytest.approx(model.num_params * 4)  # float32 measurements
    assert shard[(2, 1, 1)] == pytest.approx(shard[(1, 1, 1)] / 2)
    assert shard[(1, 2, 1)] < shard[(1, 1, 1)]
    assert {e.key: e.grad_bytes_per_gpu for e in bundled.schemes} == shard  # the bundled file is regenerated
    sync_s = ProfileCostModel(bundled).grad_sync_s([ParallelScheme(1, 1, 1)] * 4)
    assert sync_s == pytest.approx(2 * 3 / 4 * shard[(1, 1, 1)] / bundled.grad_sync_bandwidth_bytes_per_s)


def test_the_overhead_line_names_its_parts() -> None:
    result = _result(0, "hydraplan", 1.0, 1.1, overhead=0.15)
    result.path_parts_s = {"model_s": 1.0, "bookkeeping_s": 0.01, "transfer_s": 0.04, "collectives_s": 0.10}
    line = bench.target_lines([result, _result(0, "megatron", 1.2, 1.3)], [])[3]
    assert "bookkeeping 1.0% and p2p transfers 4.0%, TP/CP collectives 10.0%" in line
