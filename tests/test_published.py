"""The analytic model against published training runs (issue 13): every row of
`benchmarks/published_runs.py` predicted inside its band, and no published recipe out of memory."""

from __future__ import annotations

import pytest

from benchmarks.published import predict
from benchmarks.published_runs import GPT_MODELS, RUNS, megatron_model_flops_per_token

IDS = [run.name for run in RUNS]


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_prediction_within_the_rows_band(run) -> None:
    prediction = predict(run)
    assert abs(prediction.ratio - 1) <= run.band, f"{run.name}: predicted/published {prediction.ratio:.2f}"


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_capacity_holds_what_the_recipe_ran(run) -> None:
    prediction = predict(run)
    assert prediction.capacity_tokens >= run.micro_batch * run.seq_len


def test_the_issue_target_holds_over_the_table() -> None:
    ratios = [predict(run).ratio for run in RUNS]
    assert len(ratios) >= 10
    assert sum(abs(ratio - 1) <= 0.15 for ratio in ratios) >= 0.8 * len(ratios)
    assert all(abs(ratio - 1) <= 0.30 for ratio in ratios)


def test_megatron_mfu_converts_with_the_papers_formula() -> None:
    # Korthikanti et al. 2022: 175B at 51.4% MFU on 64 A100 with batch 64 x 2048 -> ~13.75 s per step
    run = next(run for run in RUNS if run.model == "gpt-175b")
    flops = megatron_model_flops_per_token(GPT_MODELS["gpt-175b"], 2048)
    step_s = run.global_batch * run.seq_len * flops / (run.num_gpus * 312e12 * 0.514)
    assert step_s == pytest.approx(13.75, rel=0.01)
    assert run.published_tokens_per_s_per_gpu == pytest.approx(run.global_batch * 2048 / step_s / 64)
