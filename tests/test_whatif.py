"""The what-if sweep engine: rows equal direct planner calls, the memory study, failed rows,
questions answered, tables, figures and the report, an interrupted sweep resumed."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from whatif_support import InterruptAfter, comparable, tiny_configurations

import hydraplan
from hydraplan.api.datasets import sample_batch
from hydraplan.api.files import InputError
from hydraplan.api.whatif import report as report_module
from hydraplan.api.whatif.engine import evaluate, evaluate_row
from hydraplan.api.whatif.executors import InlineExecutor, LocalPoolExecutor
from hydraplan.api.whatif.measures import model_flops_coefficients, priced
from hydraplan.api.whatif.progress import SweepProgress
from hydraplan.api.whatif.questions import fastest_within, smallest_clusters
from hydraplan.api.whatif.results import ROWS_FILE, RowsFile
from hydraplan.api.whatif.schemas import RowStatus, WhatifRow
from hydraplan.api.whatif.spec import build_spec, expand
from hydraplan.api.whatif.sweep import publish, run_sweep
from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model

QUIET = SweepProgress(0, 0, enabled=False)


def quiet(total: int) -> SweepProgress:
    return SweepProgress(total, 0, enabled=False)


# ---------------------------------------------------------------------------------------------
# Rows equal direct planner calls
# ---------------------------------------------------------------------------------------------


def test_rows_equal_direct_planner_calls() -> None:
    configurations = tiny_configurations()
    assert [c.num_gpus for c in configurations] == [8, 16]
    for index, configuration in enumerate(configurations):
        row = evaluate_row(index, configuration)
        plans = []
        for seed in (0, 1):
            lengths = sample_batch("lognormal", 6000, seed, 4096)
            plans.append(
                hydraplan.plan(
                    lengths,
                    model="tiny",
                    gpu="h100-sxm-80gb",
                    num_gpus=configuration.num_gpus,
                    time_limit_s=30.0,
                    seed=seed,
                    baselines=["megatron", "wlb"],
                )
            )
        assert row.status == RowStatus.OK and row.reason is None
        assert row.step_times_s == [plan.step_time_s for plan in plans]
        tokens = [sum(plan.input_lengths) for plan in plans]
        assert row.mean_tokens == sum(tokens) / 2
        assert row.tokens_per_s == pytest.approx(sum(tokens) / sum(row.step_times_s), rel=1e-12)
        assert row.tokens_per_s_per_gpu == pytest.approx(row.tokens_per_s / configuration.num_gpus, rel=1e-12)
        assert row.gap == max(plan.gap for plan in plans)
        assert row.strategy == Counter(plan.strategy for plan in plans).most_common(1)[0][0]
        for name in ("megatron", "wlb"):
            speedups = [next(b.speedup for b in plan.baselines if b.name == name) for plan in plans]
            assert row.speedups[name] == pytest.approx(math.sqrt(speedups[0] * speedups[1]), rel=1e-12)
        mix_gpus = Counter()
        for plan in plans:
            for pipeline in plan.pipelines:
                s = pipeline.scheme
                mix_gpus[f"<{s.tp},{s.pp},{s.cp}>"] += s.tp * s.pp * s.cp
        assert row.strategy_mix == pytest.approx({k: v / (2 * configuration.num_gpus) for k, v in mix_gpus.items()})


def test_a_baseline_as_the_planner_equals_the_baseline_plan() -> None:
    from hydraplan.planner.baselines import run_baseline
    from hydraplan.planner.schemas import PlanRequest, SolverOptions

    (configuration,) = tiny_configurations(num_gpus=[8], planners=["megatron"], seeds=1)
    row = evaluate_row(0, configuration)
    lengths = sample_batch("lognormal", 6000, 0, 4096)
    request = PlanRequest(lengths=lengths, num_gpus=8, options=SolverOptions(time_limit_s=30.0))
    expected = run_baseline("megatron", request, build_profile(get_model("tiny"), get_gpu("h100-sxm-80gb"), 8, 8))
    assert row.planner == "megatron" and row.speedups == {}
    assert row.step_times_s == [expected.step_time_s] and row.strategy == expected.strategy


def test_model_flops_are_the_palm_count_written_out() -> None:
    """6N-style FLOPs: fwd+bwd = 3x forward of every matmul and of causal attention scores."""
    model = get_model("tiny")
    h, f, kv, vocab = model.hidden_size, model.ffn_hidden_size, model.kv_dim, model.vocab_size
    matmuls = 2 * (h * (h + 2 * kv) + h * h) + 2 * 3 * h * f
    per_token = 3 * (model.num_layers * matmuls + 2 * h * vocab)
    per_sq_token = 3 * model.num_layers * 4 * h * 0.5
    assert model_flops_coefficients(model) == pytest.approx((per_token, per_sq_token), rel=1e-12)


def test_mfu_is_model_flops_over_peak() -> None:
    (configuration,) = tiny_configurations(num_gpus=[8], seeds=1)
    outcome = evaluate(0, configuration)
    (plan,) = outcome.plans
    per_token, per_sq = model_flops_coefficients(get_model("tiny"))
    lengths = [length for p in plan.pipelines for b in p.micro_batches for length in b.lengths]
    flops = per_token * sum(lengths) + per_sq * sum(length * length for length in lengths)
    peak = get_gpu("h100-sxm-80gb").peak_bf16_flops
    assert outcome.row.mfu == pytest.approx(flops / (plan.step_time_s * 8 * peak), rel=1e-9)
    assert 0 < outcome.row.mfu < 1


def test_memory_study_lists_each_scheme_capacity() -> None:
    (configuration,) = tiny_configurations(num_gpus=[8], seeds=1)
    row = evaluate_row(0, configuration)
    profile = build_profile(get_model("tiny"), get_gpu("h100-sxm-80gb"), 8, 8)
    expected = {f"<{s.tp},{s.pp},{s.cp}>": s.capacity_tokens for s in profile.schemes if s.tp * s.pp * s.cp <= 8}
    assert row.scheme_capacity_tokens == expected
    assert row.max_context_any_scheme_tokens == max(expected.values())
    assert row.max_context_every_scheme_tokens == min(expected.values())


def test_an_unplannable_configuration_is_a_row_with_its_reason() -> None:
    """llama3-70b fits no scheme of one 8 x A100-40GB node; the other row still runs."""
    configurations = tiny_configurations(models=["tiny", "llama3-70b"], gpus=["a100-40gb"], num_gpus=[8], seeds=1)
    rows = [evaluate_row(index, c) for index, c in enumerate(configurations)]
    assert [row.status for row in rows] == [RowStatus.OK, RowStatus.FAILED]
    assert "does not fit" in rows[1].reason and rows[1].tokens_per_s is None


def test_a_sequence_over_every_capacity_fails_its_row_with_the_step(tmp_path: Path) -> None:
    """llama3-8b on 8 H100s holds at most ~89K tokens per sequence: a 200K one cannot be planned."""
    batch = tmp_path / "batch.txt"
    batch.write_text("200000\n1000\n")
    (configuration,) = tiny_configurations(
        models=["llama3-8b"], datasets=[f"batch:{batch}"], context_caps=[None], num_gpus=[8], seeds=1
    )
    row = evaluate_row(0, configuration)
    assert row.status == RowStatus.FAILED
    assert row.reason.startswith("step 0 (seed 0): ")
    assert row.max_context_any_scheme_tokens < 200_000  # the memory study says why


# ---------------------------------------------------------------------------------------------
# Questions on rows whose answers are known by construction
# ---------------------------------------------------------------------------------------------


def made_rows() -> list[WhatifRow]:
    """GPU a: 8/16/32 GPUs at 100/190/350 tokens/s; GPU b: 150/280/500; b costs twice as much."""
    rows = []
    for gpu, speeds in (("a", (100.0, 190.0, 350.0)), ("b", (150.0, 280.0, 500.0))):
        for num_gpus, speed in zip((8, 16, 32), speeds):
            rows.append(
                WhatifRow(
                    index=len(rows), key=f"k{len(rows)}", model="m", gpu=gpu, num_gpus=num_gpus, gpus_per_node=8,
                    dataset="d", context_cap=None, tokens_per_step=1000, cost_source="analytic", planner="hydraplan",
                    num_steps=1, status=RowStatus.OK, step_time_s=1000 / speed, tokens_per_s=speed,
                )
            )  # fmt: skip
    return priced(rows, {"a": 1.0, "b": 2.0})


def test_smallest_cluster_per_gpu_type_reaching_a_target() -> None:
    rows = made_rows()
    by_gpu = {answer.gpu: answer for answer in smallest_clusters(rows, 250.0)}
    assert by_gpu["a"].row_index == 2 and by_gpu["b"].row_index == 4  # a needs 32 GPUs, b 16
    assert "350 tokens/s >= 250" in by_gpu["a"].text and "no smaller cluster (8, 16 GPUs)" in by_gpu["a"].text
    assert "280 tokens/s" in by_gpu["b"].text
    (missing, _) = smallest_clusters(rows, 450.0)
    assert missing.gpu == "a" and missing.row_index is None and "no configuration reaches" in missing.text
    assert "350 tokens/s" in missing.text  # the fastest it has


def test_fastest_configuration_within_a_budget() -> None:
    rows = made_rows()
    answer = fastest_within(rows, 32.0)  # a: 8, 16, 32 per hour; b: 16, 32, 64 per hour
    assert answer.row_index == 2  # a x 32 at 350 beats b x 16 at 280 for 32 per hour
    assert "the fastest of 5 configuration(s)" in answer.text and "1 faster configuration(s) cost more" in answer.text
    assert rows[2].cost_per_1m_tokens == pytest.approx(32.0 / 3600 / 350 * 1e6)
    none = fastest_within(rows, 4.0)
    assert none.row_index is None and "the cheapest" in none.text and "8.00 per hour" in none.text


# ---------------------------------------------------------------------------------------------
# Tables, figures, report
# ---------------------------------------------------------------------------------------------


def test_tables_figures_and_report_are_written(tmp_path: Path) -> None:
    spec, where = build_spec(
        {}, {"models": ["tiny"], "num_gpus": [8, 16], "context_caps": [2048, 4096], "datasets": ["lognormal"],
             "tokens_per_step": [6000], "seeds": 1, "time_limit_s": 30.0, "compare": ["megatron"],
             "price_per_gpu_hour": {"h100-sxm-80gb": 2.5}, "target_tokens_per_s": 1.0, "budget_per_hour": 100.0},
        None,
    )  # fmt: skip
    configurations = expand(spec, where, 100, False)
    rows = [evaluate_row(index, c) for index, c in enumerate(configurations)]
    publication = publish(tmp_path, spec, configurations, rows, spec.model_dump_json())
    names = {path.relative_to(tmp_path).as_posix() for path in publication.files}
    for figure in ("throughput", "cost", "speedup", "mix"):
        assert {f"plots/{figure}.png", f"plots/{figure}.svg"} <= names
        assert (tmp_path / "plots" / f"{figure}.png").read_bytes().startswith(b"\x89PNG")
        assert "<svg" in (tmp_path / "plots" / f"{figure}.svg").read_text()
    report = (tmp_path / "report.html").read_text()
    assert report.count("data:image/png;base64,") == 4
    # the cost source's published error is cited where it is published
    assert "benchmarks/RESULTS.md" in report and "section cost_model_accuracy" in report
    # answer first: the summary and the key figure open the page, the raw spec closes it, collapsed
    assert report.index("<h2>Summary</h2>") < report.index("data:image/png") < report.index("<h2>Configurations</h2>")
    assert report.index("<details><summary>Study spec (JSON)</summary>") > report.index("<h2>Memory study</h2>")
    assert "<th>step time (s)</th>" in report and "<th>step_time_s</th>" not in report
    assert report.count("<tr") >= len(rows) + 1
    with (tmp_path / "rows.csv").open() as stream:
        table = list(csv.DictReader(stream))
    assert [int(entry["num_gpus"]) for entry in table] == [row.num_gpus for row in rows]
    assert all(float(entry["cost_per_1m_tokens"]) > 0 and entry["speedup_megatron"] for entry in table)
    document = json.loads((tmp_path / "rows.json").read_text())
    # the target per context cap (the caps vary, the GPU does not), then the budget
    assert len(document["rows"]) == 4 and len(document["answers"]) == 3
    assert [answer["row_index"] for answer in document["answers"][:2]] == [0, 1]  # 1 token/s: 8 GPUs suffice
    assert (tmp_path / "memory.csv").read_text().count("\n") > 2


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "RESULTS.md"


def _headline(results: str, anchor: str, figure: str) -> str:
    """The result cell of the headline row named `figure` linking to section `anchor`."""
    row = next(line for line in results.splitlines() if line.startswith(f"| [{figure}") and f"(#{anchor})" in line)
    return row.split(" | ")[1]


def test_the_cost_source_error_quoted_in_the_report_is_the_published_one() -> None:
    """Every figure the report quotes is where it says it is published: a rerun of a benchmark that
    changes one fails here until the report's text follows."""
    results = RESULTS.read_text(encoding="utf-8")
    published = results.split("<!-- published:start -->")[1].split("<!-- published:end -->")[0]
    assert "Held-out rows: 11 rows: median ratio 1.08 (range 1.00-1.22)" in published
    assert "within +-30%: 11 of 11" in published
    assert "median of 1.08 on 11 held-out runs (range 1.00-1.22, all within +-30%)" in report_module.ANALYTIC_ERROR
    calibrated = _headline(results, "cost_model_accuracy", "Stage time error, calibration-only schemes")
    assert calibrated == "12.5%" and "a median of 12.5%" in report_module.ANALYTIC_ERROR
    held_out = _headline(results, "cost_model_accuracy", "Stage time error, measured schemes, held out")
    assert held_out == "9.0% / 22.0%" and "median 9.0%, p95 22.0%" in report_module.PROFILE_ERROR


# ---------------------------------------------------------------------------------------------
# Interrupted sweeps and --resume
# ---------------------------------------------------------------------------------------------


def test_resume_computes_only_what_an_interrupted_sweep_did_not_finish(tmp_path: Path) -> None:
    configurations = tiny_configurations(num_gpus=[8, 16, 32], seeds=1)
    interrupted = InterruptAfter(2)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(configurations, interrupted, RowsFile(tmp_path, configurations, resume=False), quiet(3))
    kept = (tmp_path / ROWS_FILE).read_text().splitlines()
    assert len(kept) == 2
    resumed = InterruptAfter(None)
    rows_file = RowsFile(tmp_path, configurations, resume=True)
    assert len(rows_file.finished) == 2
    rows = run_sweep(configurations, resumed, rows_file, quiet(3))
    assert resumed.given == [2]  # only the unfinished configuration was computed
    assert (tmp_path / ROWS_FILE).read_text().splitlines()[:2] == kept  # finished rows untouched
    assert comparable(rows) == comparable([evaluate_row(i, c) for i, c in enumerate(configurations)])
    again = InterruptAfter(None)
    run_sweep(configurations, again, RowsFile(tmp_path, configurations, resume=True), quiet(3))
    assert again.given == []


def test_a_torn_last_line_is_recomputed(tmp_path: Path) -> None:
    configurations = tiny_configurations(num_gpus=[8], seeds=1)
    run_sweep(configurations, InlineExecutor(), RowsFile(tmp_path, configurations, resume=False), quiet(1))
    path = tmp_path / ROWS_FILE
    path.write_text(path.read_text()[:-30])  # killed mid-write
    assert RowsFile(tmp_path, configurations, resume=True).finished == {}


def test_resume_refuses_another_sweep_and_a_fresh_run_refuses_a_used_folder(tmp_path: Path) -> None:
    configurations = tiny_configurations(num_gpus=[8], seeds=1)
    run_sweep(configurations, InlineExecutor(), RowsFile(tmp_path, configurations, resume=False), quiet(1))
    with pytest.raises(InputError, match="holds the rows of a sweep already; add --resume"):
        RowsFile(tmp_path, configurations, resume=False)
    with pytest.raises(InputError, match="holds another sweep"):
        RowsFile(tmp_path, tiny_configurations(num_gpus=[16], seeds=1), resume=True)
    with pytest.raises(InputError, match="holds no sweep"):
        RowsFile(tmp_path / "empty", configurations, resume=True)


def test_the_process_pool_gives_the_rows_of_the_inline_executor(tmp_path: Path) -> None:
    configurations = tiny_configurations(num_gpus=[8, 16], seeds=1)
    pooled = run_sweep(
        configurations, LocalPoolExecutor(2), RowsFile(tmp_path / "pool", configurations, resume=False), quiet(2)
    )
    inline = run_sweep(
        configurations, InlineExecutor(), RowsFile(tmp_path / "inline", configurations, resume=False), quiet(2)
    )
    assert comparable(pooled) == comparable(inline)


# ---------------------------------------------------------------------------------------------
# Cost sources, datasets, progress
# ---------------------------------------------------------------------------------------------


def test_a_profile_cost_source_plans_with_the_profile(tmp_path: Path) -> None:
    """A measured/calibrated profile: its own model and GPU name the row; no catalog model, no MFU."""
    from synthetic import synthetic_profile

    profile = synthetic_profile(max_gpus=16)
    path = tmp_path / "measured.json"
    path.write_text(profile.model_dump_json())
    (configuration,) = tiny_configurations(cost_sources=[f"profile:{path}"], num_gpus=[16], seeds=1)
    row = evaluate_row(0, configuration)
    expected = hydraplan.plan_with_profile(
        sample_batch("lognormal", 6000, 0, 4096), profile, num_gpus=16, time_limit_s=30.0, seed=0,
        baselines=["megatron", "wlb"],
    )  # fmt: skip
    assert (row.model, row.gpu, row.cost_source) == ("synthetic-8b", "synthetic", f"profile:{path}")
    assert row.step_times_s == [expected.step_time_s] and row.mfu is None
    assert row.scheme_capacity_tokens  # the memory study of the profile's schemes


def test_a_lengths_file_is_a_dataset_to_draw_from(tmp_path: Path) -> None:
    path = tmp_path / "documents.txt"
    path.write_text("\n".join(["300", "1200", "5000", "700"]) + "\n")
    (configuration,) = tiny_configurations(datasets=[f"lengths:{path}"], num_gpus=[8], seeds=1)
    outcome = evaluate(0, configuration)
    (plan,) = outcome.plans
    assert outcome.row.dataset == f"lengths:{path}" and outcome.row.tokens_per_step == 6000
    assert sum(plan.input_lengths) >= 6000 and set(plan.input_lengths) <= {300, 1200, 4096, 904, 700}


def test_an_exact_batch_is_one_configuration_whatever_the_tokens_per_step(tmp_path: Path) -> None:
    path = tmp_path / "batch.json"
    path.write_text("[4096, 1024, 512, 8192, 2048, 300, 7000, 128]")
    configurations = tiny_configurations(datasets=[f"batch:{path}", "lognormal"], tokens_per_step=[6000, 9000])
    kinds = Counter((c.dataset.kind.value, c.tokens_per_step) for c in configurations)
    assert kinds == {("batch", None): 2, ("bundled", 6000): 2, ("bundled", 9000): 2}  # x 2 cluster sizes
    row = evaluate_row(0, configurations[0])
    assert row.dataset.startswith("batch:") and row.mean_tokens == sum(
        [4096, 1024, 512, 4096, 4096, 2048, 300, 4096, 2904, 128]
    )


def test_progress_shows_done_total_rate_and_time_left() -> None:
    import io

    stream = io.StringIO()
    progress = SweepProgress(4, 1, enabled=True, stream=stream)
    progress.start()
    progress.advance()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("hydraplan: whatif [######------------------] 1/4 rows, 0.00 rows/s, time left unknown")
    assert "2/4 rows" in lines[1] and "rows/s" in lines[1] and "s left" in lines[1]
    progress.advance(), progress.advance()
    assert "4/4 rows" in stream.getvalue().splitlines()[-1] and "done in" in stream.getvalue()


def test_progress_on_a_terminal_redraws_one_cleared_line() -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = SweepProgress(3, 1, enabled=True, stream=stream)
    progress.start()
    progress.advance(), progress.advance()
    progress.finish()
    drawn = stream.getvalue()
    redraws = drawn.split("\r")[1:]
    assert redraws and all(part.startswith("\x1b[2K") for part in redraws)  # each redraw clears the line first
    assert "hydraplan: whatif" in redraws[-1] and "3/3" in redraws[-1] and "done in" in redraws[-1]
    assert drawn.removesuffix("\x1b[?25h").endswith("\n")  # the finished bar keeps its own line


def test_a_target_is_answered_per_model_when_models_vary_too() -> None:
    rows = made_rows()
    bigger = [
        row.model_copy(update={"model": "big", "index": row.index + 6, "tokens_per_s": row.tokens_per_s / 2})
        for row in rows
    ]
    answers = smallest_clusters(rows + bigger, 170.0)
    assert [(a.gpu, a.row_index) for a in answers] == [("a", 1), ("b", 4), ("a", 8), ("b", 11)]
    assert answers[2].text.startswith("a, model big: ")


def test_a_sweep_comparing_an_interleaved_baseline_prices_its_recipe() -> None:
    """`compare: [megatron-vpp]` adds the interleaved schemes of the model's recipe chunk counts to
    each configuration's analytic profile (Llama 3 8B on 16 GPUs: v 4 at pp 2, v 2 at pp 4); a
    sweep of plain baselines keeps the plain profile."""
    from hydraplan.api.whatif.engine import configuration_profile

    vpp = tiny_configurations(models=["llama3-8b"], num_gpus=[16], compare=["megatron", "megatron-vpp"])[0]
    plain = tiny_configurations(models=["llama3-8b"], num_gpus=[16])[0]
    chunks = {(entry.pp, entry.v) for entry in configuration_profile(vpp).schemes if entry.v > 1}
    assert {v for _, v in chunks} == {2, 4} and {(2, 4), (4, 2)} <= chunks
    assert all(entry.v == 1 for entry in configuration_profile(plain).schemes)
