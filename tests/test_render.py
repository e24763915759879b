"""Text renderings of plans and profiles (api/render/plan_text.py, api/render/schemes.py)."""

from __future__ import annotations

import pytest

from hydraplan.api.render.plan_text import format_ranks, render_plan, render_pool
from hydraplan.api.render.schemes import render_schemes
from hydraplan.planner.schemas import (
    BaselineResult,
    CostProfile,
    MicroBatch,
    PipelinePlan,
    Plan,
    PoolMemberModel,
    SchemeModel,
    SolverStats,
    StrategyPoolFile,
)


@pytest.fixture
def profile(user_profile_data: dict) -> CostProfile:
    return CostProfile.model_validate(
        {**user_profile_data, "source": "analytic", "model": "llama3-8b", "gpu": "h100-sxm-80gb"}
    )


def _pipeline(index: int, tp: int, pp: int, cp: int, first_rank: int, batches: list[list[int]]) -> PipelinePlan:
    num_gpus = tp * pp * cp
    ranks = list(range(first_rank, first_rank + num_gpus))
    micro_batches = []
    next_id = index * 100
    for lengths in batches:
        ids = list(range(next_id, next_id + len(lengths)))
        next_id += len(lengths)
        micro_batches.append(
            MicroBatch(
                sequence_ids=ids,
                lengths=lengths,
                offsets=[0] * len(lengths),
                num_tokens=sum(lengths),
                stage_time_s=0.01,
            )
        )
    return PipelinePlan(
        index=index,
        scheme=SchemeModel(tp=tp, pp=pp, cp=cp),
        ranks=ranks,
        stage_ranks=[ranks[stage * tp * cp : (stage + 1) * tp * cp] for stage in range(pp)],
        capacity_tokens=30000,
        num_sequences=sum(len(lengths) for lengths in batches),
        num_tokens=sum(sum(lengths) for lengths in batches),
        time_s=0.5 + index / 10,
        micro_batches=micro_batches,
    )


def _plan(
    profile: CostProfile,
    baselines: list[BaselineResult] | None = None,
    dropped: list[int] | None = None,
) -> Plan:
    pipelines = [
        _pipeline(0, 8, 1, 2, 0, [[20000, 4000], [9000]]),
        _pipeline(1, 4, 2, 1, 16, [[1000, 2000, 3000]]),
    ]
    return Plan(
        plan_id="abc123",
        status="optimal",
        strategy="1x<8,1,2> + 1x<4,2,1>",
        num_gpus=24,
        gpus_per_node=8,
        step_time_s=0.64,
        grad_sync_s=0.04,
        objective_s=0.64,
        lower_bound_s=0.632,
        gap=0.0125,
        input_lengths=[1] * 6,
        dropped_sequence_ids=dropped or [],
        split_sequence_ids=[2],
        pipelines=pipelines,
        cost_profile=profile,
        solver=SolverStats(
            backend="greedy",
            num_schemes=4,
            num_strategies=10,
            num_strategies_solved=3,
            seed=0,
        ),
        baselines=baselines or [],
    )


def test_plan_summary_has_the_headline_facts(profile: CostProfile) -> None:
    text = render_plan(_plan(profile))
    for fact in (
        "llama3-8b on h100-sxm-80gb (analytic profile)",
        "24 GPUs, 8 per node",
        "1x<8,1,2> + 1x<4,2,1>",
        "optimal",
        "640.0 ms (slowest pipeline 600.0 ms + grad sync 40.0 ms)",
        "632.0 ms (gap 1.25%)",
        "greedy: 4 schemes, 10 strategies, 3 solved, seed 0\n",
        "1 sequences cut into chunks",
        "dropped      0 sequences",
    ):
        assert fact in text, fact
    assert "baseline" not in text
    assert "objective" not in text  # no previous strategy, nothing to switch from
    cut = _plan(profile)
    cut = cut.model_copy(update={"solver": cut.solver.model_copy(update={"cut_by_clock": True})})
    assert "seed 0 (cut by the clock: another run may differ)" in render_plan(cut)


def test_a_baseline_plan_says_its_bound_is_the_baselines_own(profile: CostProfile) -> None:
    plan = _plan(profile)
    plan = plan.model_copy(update={"solver": plan.solver.model_copy(update={"backend": "baseline:flexsp"})})
    bound = next(line for line in render_plan(plan).splitlines() if line.startswith("lower bound"))
    assert bound.split(None, 2)[2] == "632.0 ms (flexsp's own, over the schemes it chose; gap 1.25%)"


def test_plan_table_has_one_row_per_pipeline(profile: CostProfile) -> None:
    lines = render_plan(_plan(profile)).splitlines()
    header = next(index for index, line in enumerate(lines) if line.startswith("pipeline"))
    rows = lines[header + 2 : header + 4]
    assert rows[0].split()[:3] == ["0", "<8,1,2>", "0-15"]
    assert "33,000" in rows[0] and "24,000 / 30,000" in rows[0] and "500.0 ms" in rows[0]
    assert rows[1].split()[:3] == ["1", "<4,2,1>", "16-23"]
    assert "6,000" in rows[1] and "600.0 ms" in rows[1]


def test_baselines_are_shown_with_speedup(profile: CostProfile) -> None:
    baseline = BaselineResult(name="megatron", strategy="3x<4,2,1>", step_time_s=0.96, speedup=1.5)
    text = render_plan(_plan(profile, baselines=[baseline]))
    row = next(line for line in text.splitlines() if line.startswith("megatron"))
    assert row.split() == ["megatron", "3x<4,2,1>", "960.0", "ms", "1.50x"]


def test_switch_cost_is_shown_with_a_previous_strategy(profile: CostProfile) -> None:
    plan = _plan(profile).model_copy(
        update={"previous_strategy": "2x<4,2,1>", "switch_cost_s": 0.1, "objective_s": 0.74}
    )
    text = render_plan(plan)
    assert "previous     2x<4,2,1>" in text
    assert "objective    740.0 ms (step time + switch cost 100.0 ms)" in text


def test_dropped_ids_are_listed_up_to_a_limit(profile: CostProfile) -> None:
    assert "2 sequences (ids 3, 5)" in render_plan(_plan(profile, dropped=[3, 5]))
    assert "(ids 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...)" in render_plan(_plan(profile, dropped=list(range(12))))


def test_a_plan_without_model_names_still_renders(profile: CostProfile, user_profile_data: dict) -> None:
    unnamed = CostProfile.model_validate(user_profile_data)
    plan = _plan(profile).model_copy(update={"cost_profile": unnamed})
    assert "unnamed model on unnamed GPU (user profile)" in render_plan(plan)


def test_sub_10_ms_times_keep_three_significant_digits(profile: CostProfile) -> None:
    plan = _plan(profile).model_copy(update={"step_time_s": 0.000412, "grad_sync_s": 0.0, "objective_s": 0.000412})
    assert "step time    0.412 ms" in render_plan(plan)
    assert "grad sync 0 ms" in render_plan(plan)


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], "-"),
        ([3], "3"),
        (list(range(16)), "0-15"),
        ([8, 9, 0, 1, 2, 3], "0-3,8-9"),
        ([0, 2, 4], "0,2,4"),
    ],
)
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_scheme_table_converts_to_seconds_and_derives_capacities(profile: CostProfile) -> None:
    text = render_schemes(profile)
    assert text.startswith("cost profile: analytic, llama3-8b on h100-sxm-80gb, 32 layers, 4 schemes")
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("<")}
    assert list(rows) == ["<1,1,1>", "<2,1,1>", "<4,2,1>", "<8,1,2>"]  # by GPUs per pipeline
    # time_unit ms -> seconds: a = 2e-6 ms = 2e-9 s, b = 0.12 ms = 1.2e-4 s, c = 1 ms.
    assert rows["<1,1,1>"] == [
        "<1,1,1>",
        "1",
        "2.000e-09",
        "1.200e-04",
        "1.000e-03",
        "0.33",
        "8,192",
    ]
    # Derived: (80e9 - 20e9 static) / (1e6 bytes/token * 2 in-flight micro-batches) = 30,000.
    assert rows["<4,2,1>"][1] == "8" and rows["<4,2,1>"][-1] == "30,000"
    assert rows["<8,1,2>"][1] == "16"


def test_a_measured_profile_says_where_its_measurements_stop() -> None:
    from hydraplan.cost_models.profile_io import bundled_profile

    profile = bundled_profile("tiny-cpu")
    text = render_schemes(profile)
    assert "longest measured" in text and "extrapolated" in text
    longest = max(max(s.lengths) for s in profile.provenance.samples if s.key == (1, 1, 1) and not s.oom)
    row = next(line for line in text.splitlines() if line.startswith("<1,1,1>"))
    # regenerated 2026-12-03 with the real-peak memory fit: its margin over the envelope is shown
    margin = next(fit.memory_margin for fit in profile.provenance.fits if (fit.tp, fit.pp, fit.cp) == (1, 1, 1))
    noise = next(fit.memory_noise_bytes for fit in profile.provenance.fits if (fit.tp, fit.pp, fit.cp) == (1, 1, 1))
    shown = f"real peak +{margin:.0%}" + (f" +{noise / 2**20:.2f} MiB" if noise else "")
    assert f"{longest:,}" in row.split() and row.endswith(shown)
    fits = [fit.model_copy(update={"memory_fitted_to": "saved_tensors"}) for fit in profile.provenance.fits]
    saved = profile.model_copy(update={"provenance": profile.provenance.model_copy(update={"fits": fits})})
    saved_row = next(line for line in render_schemes(saved).splitlines() if line.startswith("<1,1,1>"))
    assert saved_row.endswith("saved tensors") and not row.endswith("saved tensors")


def _many_pipelines_plan(profile: CostProfile, num_small: int) -> Plan:
    """One <8,1,2> pipeline and `num_small` <1,1,1> ones (times 0.5 + index / 10 s)."""
    pipelines = [_pipeline(0, 8, 1, 2, 0, [[20000]])]
    pipelines += [_pipeline(1 + index, 1, 1, 1, 16 + index, [[100 * (index + 1)]]) for index in range(num_small)]
    return _plan(profile).model_copy(
        update={"pipelines": pipelines, "strategy": f"1x<8,1,2> + {num_small}x<1,1,1>", "num_gpus": 16 + num_small}
    )


def _table_rows(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("pipeline"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip() or line.startswith("("):
            break
        rows.append(line)
    return rows


def test_large_plans_print_one_row_per_scheme(profile: CostProfile) -> None:
    plan = _many_pipelines_plan(profile, 20)
    rows = _table_rows(render_plan(plan))  # auto: 21 pipelines is past MAX_PIPELINE_ROWS
    assert len(rows) == 2
    small = next(row for row in rows if "<1,1,1>" in row)
    assert small.split()[0] == "20x" and "16-35" in small
    assert f"{sum(100 * (i + 1) for i in range(20)):,}" in small  # tokens summed over the group
    # the slowest pipeline (the last <1,1,1>, 0.5 + 20 / 10 s) is named in its group's time range
    assert "600.0 ms - 2,500.0 ms (slowest #20)" in small
    assert len(_table_rows(render_plan(plan, "all"))) == 21


def test_small_plans_keep_one_row_per_pipeline_unless_grouped(profile: CostProfile) -> None:
    plan = _many_pipelines_plan(profile, 3)
    assert len(_table_rows(render_plan(plan))) == 4
    grouped = _table_rows(render_plan(plan, "grouped"))
    assert [row.split()[0] for row in grouped] == ["1x", "3x"]


def test_pool_summary_shows_missing_figures_as_a_dash() -> None:
    """A pool file may leave its expected step times out: shown as '-', not a crash."""
    pool = StrategyPoolFile(strategies=["2x<4,1,1>"], expected_step_time_s=0.0123)
    text = render_pool(pool, num_candidates=3)
    assert "expected step time with the pool: 12.3 ms" in text
    assert "with each batch's best candidate:  -" in text and "with the best single strategy:     -" in text


def test_pool_summary_says_how_many_candidates_the_budget_solved_on_every_batch() -> None:
    member = PoolMemberModel(strategy="2x<4,1,1>", share=1.0, mean_step_time_s=0.01)
    pool = StrategyPoolFile(strategies=["2x<4,1,1>"], members=[member], num_batches=20, dataset="wikipedia")
    first = render_pool(pool, num_candidates=9, num_evaluated=3).splitlines()[0]
    assert first == (
        "strategy pool of 1 from 9 candidates over 20 wikipedia batches (3 solved on every batch within the budget)"
    )
    assert "solved on every batch" not in render_pool(pool, num_candidates=9, num_evaluated=9)
