"""Readable text renderings of a `Plan` and of a strategy pool (pure: strings in, strings out).

The tables are drawn by `api.render.tables` (rich, plain text). This lived in `planner/` until the
tables came from a library: the planner imports only numpy, pydantic and its solvers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from hydraplan.api.render.tables import table_text
from hydraplan.planner.schemas import CostProfile, PipelinePlan, Plan, StrategyPoolFile
from hydraplan.planner.scheme import ParallelScheme

# At most this many dropped sequence ids are spelled out in the summary.
MAX_IDS_SHOWN = 10
# Past this many pipelines, `pipelines="auto"` prints one row per scheme instead of per pipeline.
MAX_PIPELINE_ROWS = 16
# A plan a baseline made names it in its solver backend: `baseline:flexsp` (planner/baselines.py).
BASELINE_BACKEND = "baseline:"


def render_plan(plan: Plan, pipelines: Literal["auto", "grouped", "all"] = "auto") -> str:
    """A summary of `plan`: headline facts, the pipelines table, then any baselines.

    The table has one row per pipeline (`all`, or `auto` up to `MAX_PIPELINE_ROWS` pipelines) or
    one row per scheme (`grouped`, or `auto` above that).
    """
    grouped = pipelines == "grouped" or (pipelines == "auto" and len(plan.pipelines) > MAX_PIPELINE_ROWS)
    table = _grouped_pipeline_table(plan.pipelines) if grouped else _pipeline_table(plan.pipelines)
    sections = [_plan_header(plan), table]
    if plan.baselines:
        sections.append(_baseline_table(plan))
    return "\n\n".join(sections) + "\n"


def render_pool(pool: StrategyPoolFile, num_candidates: int, num_evaluated: int | None = None) -> str:
    """A strategy pool: one row per member, then the expected step time against the alternatives;
    `num_evaluated` of the candidates were solved on every batch (all when None)."""
    rows = [
        [member.strategy, f"{member.share:.0%}", f"{member.mean_step_time_s * 1e3:,.1f}"] for member in pool.members
    ]
    table = table_text(["strategy", "batches served", "mean step (ms)"], rows, right_from=1)
    lines = [
        f"strategy pool of {len(pool.members)} from {num_candidates} candidates over {pool.num_batches} "
        f"{pool.dataset or ''} batches".replace("  ", " ")
        + (
            f" ({num_evaluated} solved on every batch within the budget)"
            if num_evaluated is not None and num_evaluated < num_candidates
            else ""
        ),
        "",
        table,
        "",
        f"expected step time with the pool: {_ms(pool.expected_step_time_s)}",
        f"with each batch's best candidate:  {_ms(pool.unrestricted_step_time_s)}",
        f"with the best single strategy:     {_ms(pool.best_single_step_time_s)}",
    ]
    return "\n".join(lines) + "\n"


def format_ranks(ranks: Sequence[int]) -> str:
    """Compact rank list: `[0, 1, 2, 3, 8, 9]` -> `0-3,8-9`."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "-"
    runs: list[tuple[int, int]] = []
    start = previous = ordered[0]
    for rank in ordered[1:]:
        if rank != previous + 1:
            runs.append((start, previous))
            start = rank
        previous = rank
    runs.append((start, previous))
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


# ---------------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------------


def model_on_gpu(profile: CostProfile) -> str:
    """`llama3-8b on h100-sxm-80gb` (or `unnamed model` / `unnamed GPU`)."""
    model = profile.model or "unnamed model"
    gpu = profile.gpu or "unnamed GPU"
    return f"{model} on {gpu}"


def _ms(seconds: float | None) -> str:
    """Milliseconds: one decimal from 10 ms up, three significant digits below (tiny models);
    `-` for a figure the file does not give."""
    if seconds is None:
        return "-"
    milliseconds = seconds * 1e3
    if abs(milliseconds) >= 10:
        return f"{milliseconds:,.1f} ms"
    return f"{milliseconds:.3g} ms"


def _split(plan: Plan) -> str:
    """Sequences cut into chunks (`--oversize split`), and the tokens that lost attention context:
    every token of a chunk after a sequence's first attends only to its own chunk."""
    if not plan.split_sequence_ids:
        return "0 sequences cut into chunks"
    split = set(plan.split_sequence_ids)
    chunks = lost = 0
    for pipeline in plan.pipelines:
        for batch in pipeline.micro_batches:
            for sequence_id, offset, length in zip(batch.sequence_ids, batch.offsets, batch.lengths):
                if sequence_id in split:
                    chunks += 1
                    lost += length if offset > 0 else 0
    return (
        f"{len(split):,} sequences cut into chunks ({chunks:,} chunks; {lost:,} tokens trained without "
        "the attention context before their chunk)"
    )


def _plan_header(plan: Plan) -> str:
    slowest_s = max((pipeline.time_s for pipeline in plan.pipelines), default=0.0)
    num_tokens = sum(plan.input_lengths)
    solver = plan.solver
    facts = [
        ("plan", f"{plan.plan_id} ({plan.schema_version})"),
        ("model", f"{model_on_gpu(plan.cost_profile)} ({plan.cost_profile.source} profile)"),
        ("cluster", f"{plan.num_gpus} GPUs, {plan.gpus_per_node} per node"),
        ("strategy", plan.strategy),
        ("status", str(plan.status)),
        (
            "step time",
            f"{_ms(plan.step_time_s)} (slowest pipeline {_ms(slowest_s)} + grad sync {_ms(plan.grad_sync_s)})",
        ),
        *_switch_facts(plan),
        ("lower bound", _bound(plan)),
        (
            "solver",
            f"{solver.backend}: {solver.num_schemes} schemes, "
            f"{solver.num_strategies} strategies, {solver.num_strategies_solved} solved, seed {solver.seed}"
            + (f"; grown from {solver.winner}'s plan" if solver.winner != "search" else "")
            + (" (cut by the clock: another run may differ)" if solver.cut_by_clock else ""),
        ),
        ("sequences", f"{len(plan.input_lengths):,} ({num_tokens:,} tokens)"),
        ("split", _split(plan)),
        ("dropped", _dropped(plan.dropped_sequence_ids)),
    ]
    width = max(len(label) for label, _ in facts)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in facts)


def _bound(plan: Plan) -> str:
    """The lower bound and the gap to it, saying whose bound it is when a baseline made the plan:
    a baseline's bound holds over the schemes it chose only, so it is not hydraplan's."""
    gap = f"gap {plan.gap * 100:.2f}%"
    baseline = baseline_name(plan)
    if baseline is None:
        return f"{_ms(plan.lower_bound_s)} ({gap})"
    return f"{_ms(plan.lower_bound_s)} ({baseline}'s own, over the schemes it chose; {gap})"


def baseline_name(plan: Plan) -> str | None:
    """The baseline that made `plan` (solver backend `baseline:NAME`), or None for hydraplan's own."""
    backend = plan.solver.backend
    return backend.removeprefix(BASELINE_BACKEND) if backend.startswith(BASELINE_BACKEND) else None


def _switch_facts(plan: Plan) -> list[tuple[str, str]]:
    """The objective when the plan was made with the previous step's strategy as context."""
    if plan.previous_strategy is None:
        return []
    return [
        ("previous", plan.previous_strategy),
        (
            "objective",
            f"{_ms(plan.objective_s)} (step time + switch cost {_ms(plan.switch_cost_s)})",
        ),
    ]


def _dropped(sequence_ids: Sequence[int]) -> str:
    if not sequence_ids:
        return "0 sequences"
    shown = ", ".join(str(index) for index in sequence_ids[:MAX_IDS_SHOWN])
    more = ", ..." if len(sequence_ids) > MAX_IDS_SHOWN else ""
    return f"{len(sequence_ids):,} sequences (ids {shown}{more})"


def _pipeline_table(pipelines: Sequence[PipelinePlan]) -> str:
    headers = [
        "pipeline",
        "scheme",
        "ranks",
        "seqs",
        "tokens",
        "micro-batches",
        "largest mb / capacity",
        "time",
    ]
    rows = []
    for pipeline in pipelines:
        scheme = pipeline.scheme.scheme
        largest = max((batch.num_tokens for batch in pipeline.micro_batches), default=0)
        rows.append(
            [
                str(pipeline.index),
                str(scheme),
                format_ranks(pipeline.ranks),
                f"{pipeline.num_sequences:,}",
                f"{pipeline.num_tokens:,}",
                str(len(pipeline.micro_batches)),
                f"{largest:,} / {pipeline.capacity_tokens:,}",
                _ms(pipeline.time_s),
            ]
        )
    return table_text(headers, rows, right_from=3)


def _grouped_pipeline_table(pipelines: Sequence[PipelinePlan]) -> str:
    """One row per scheme: how many pipelines run it, their ranks, totals and ranges."""
    groups: dict[ParallelScheme, list[PipelinePlan]] = {}
    for pipeline in pipelines:
        scheme = pipeline.scheme.scheme
        groups.setdefault(scheme, []).append(pipeline)
    slowest = max(pipelines, key=lambda pipeline: pipeline.time_s, default=None)
    headers = ["pipelines", "scheme", "ranks", "seqs", "tokens", "micro-batches", "largest mb / capacity", "time"]
    rows = []
    for scheme, members in groups.items():
        counts = [len(pipeline.micro_batches) for pipeline in members]
        times = [pipeline.time_s for pipeline in members]
        largest = max((batch.num_tokens for pipeline in members for batch in pipeline.micro_batches), default=0)
        marker = f" (slowest #{slowest.index})" if slowest is not None and slowest in members else ""
        rows.append(
            [
                f"{len(members)}x",
                str(scheme),
                format_ranks([rank for pipeline in members for rank in pipeline.ranks]),
                f"{sum(pipeline.num_sequences for pipeline in members):,}",
                f"{sum(pipeline.num_tokens for pipeline in members):,}",
                _span(min(counts), max(counts), str),
                f"{largest:,} / {members[0].capacity_tokens:,}",
                _span(min(times), max(times), _ms) + marker,
            ]
        )
    return table_text(headers, rows, right_from=3) + "\n(one row per scheme: sums, and the range over its pipelines)"


def _span(low, high, show) -> str:
    """`low-high`, or one value when they are equal."""
    return show(low) if low == high else f"{show(low)} - {show(high)}"


def _baseline_table(plan: Plan) -> str:
    headers = ["baseline", "strategy", "step time", "speedup of this plan"]
    rows = [
        [baseline.name, baseline.strategy, _ms(baseline.step_time_s), f"{baseline.speedup:.2f}x"]
        if baseline.error is None
        else [baseline.name, f"could not plan: {baseline.error}", "-", "-"]
        for baseline in plan.baselines
    ]
    return table_text(headers, rows, right_from=2)
