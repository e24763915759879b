"""The independent plan checker: the specification every plan must meet.

It recomputes everything from the plan's inputs and the cost profile, trusting nothing the solver
reported: sequence coverage, capacities, rank layout, stage times, the 1F1B pipeline times, the
gradient sync and the step time, the bound and the gap.
"""

from __future__ import annotations

import math
from collections import defaultdict

from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile, PipelinePlan, Plan
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.simulate import simulate_1f1b
from hydraplan.planner.strategies import Strategy, parse_strategy
from hydraplan.planner.switching import switch_cost_s

RELATIVE_TOLERANCE = 1e-6


def check_plan(plan: Plan, profile: CostProfile | None = None) -> list[str]:
    """Every violation found (empty when the plan is valid).

    Costs are recomputed from `profile` when given (it must contain every scheme the plan uses),
    else from the profile embedded in the plan.
    """
    violations: list[str] = []
    try:
        cost = ProfileCostModel(profile or plan.cost_profile)
    except ValueError as error:
        return [f"cost profile: {error}"]
    violations += _check_ranks(plan)
    violations += _check_coverage(plan)
    pipeline_times = []
    for pipeline in plan.pipelines:
        pipeline_violations, time_s = _check_pipeline(pipeline, cost)
        violations += pipeline_violations
        pipeline_times.append(time_s)
    if violations:
        return violations
    return _check_totals(plan, cost, pipeline_times)


def _close(left: float, right: float) -> bool:
    return math.isclose(left, right, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)


def _schemes(plan: Plan) -> list[ParallelScheme]:
    return [ParallelScheme(p.scheme.tp, p.scheme.pp, p.scheme.cp) for p in plan.pipelines]


def _check_ranks(plan: Plan) -> list[str]:
    violations = []
    if not plan.pipelines:
        return ["plan has no pipelines"]
    seen: set[int] = set()
    for pipeline in plan.pipelines:
        scheme = ParallelScheme(pipeline.scheme.tp, pipeline.scheme.pp, pipeline.scheme.cp)
        label = f"pipeline {pipeline.index} {scheme}"
        if len(pipeline.ranks) != scheme.num_gpus:
            violations.append(f"{label}: {len(pipeline.ranks)} ranks, scheme needs {scheme.num_gpus}")
        if len(pipeline.stage_ranks) != scheme.pp or any(len(s) != scheme.gpus_per_stage for s in pipeline.stage_ranks):
            violations.append(f"{label}: stage_ranks must be {scheme.pp} lists of {scheme.gpus_per_stage} ranks")
        elif [rank for stage in pipeline.stage_ranks for rank in stage] != pipeline.ranks:
            violations.append(f"{label}: stage_ranks do not flatten to ranks")
        overlap = seen.intersection(pipeline.ranks)
        if overlap or len(set(pipeline.ranks)) != len(pipeline.ranks):
            violations.append(f"{label}: ranks used twice ({sorted(overlap)[:5]})")
        seen.update(pipeline.ranks)
    if seen != set(range(plan.num_gpus)):
        missing = sorted(set(range(plan.num_gpus)) - seen)[:5]
        extra = sorted(seen - set(range(plan.num_gpus)))[:5]
        violations.append(f"ranks do not cover 0..{plan.num_gpus - 1} exactly (missing {missing}, outside {extra})")
    if [p.index for p in plan.pipelines] != list(range(len(plan.pipelines))):
        violations.append("pipeline indices are not 0..P-1 in order")
    return violations


def _check_coverage(plan: Plan) -> list[str]:
    """Every input sequence tiled exactly once by its chunks, unless listed as dropped."""
    violations = []
    chunks: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for pipeline in plan.pipelines:
        for batch in pipeline.micro_batches:
            for sequence_id, offset, length in zip(batch.sequence_ids, batch.offsets, batch.lengths):
                chunks[sequence_id].append((offset, length))
    dropped = set(plan.dropped_sequence_ids)
    split = set(plan.split_sequence_ids)
    for sequence_id, length in enumerate(plan.input_lengths):
        pieces = sorted(chunks.pop(sequence_id, []))
        if sequence_id in dropped:
            if pieces:
                violations.append(f"sequence {sequence_id} is listed as dropped but placed")
            continue
        if not pieces:
            violations.append(f"sequence {sequence_id} ({length} tokens) is missing")
            continue
        if len(pieces) > 1 and sequence_id not in split:
            violations.append(f"sequence {sequence_id} is placed {len(pieces)} times but not listed as split")
        position = 0
        for offset, piece in pieces:
            if offset != position or piece < 1:
                violations.append(f"sequence {sequence_id}: chunks do not tile its tokens (at offset {offset})")
                break
            position += piece
        else:
            if position != length:
                violations.append(f"sequence {sequence_id}: chunks cover {position} of {length} tokens")
    if chunks:
        violations.append(f"unknown sequence ids placed: {sorted(chunks)[:5]}")
    return violations


def _check_pipeline(pipeline: PipelinePlan, cost: ProfileCostModel) -> tuple[list[str], float]:
    scheme = ParallelScheme(pipeline.scheme.tp, pipeline.scheme.pp, pipeline.scheme.cp)
    label = f"pipeline {pipeline.index} {scheme}"
    try:
        coef = cost.coefficients(scheme)
    except ValueError as error:
        return [f"{label}: {error}"], 0.0
    violations = []
    if not pipeline.micro_batches:
        violations.append(f"{label}: has no micro-batches (idle GPUs)")
    if pipeline.capacity_tokens != coef.capacity_tokens:
        violations.append(
            f"{label}: capacity {pipeline.capacity_tokens} differs from the profile's {coef.capacity_tokens}"
        )
    stage_times = []
    for position, batch in enumerate(pipeline.micro_batches):
        where = f"{label} micro-batch {position}"
        if not (len(batch.sequence_ids) == len(batch.lengths) == len(batch.offsets)) or not batch.lengths:
            violations.append(f"{where}: sequence_ids, lengths and offsets must be equal-length and non-empty")
            continue
        if sum(batch.lengths) != batch.num_tokens:
            violations.append(f"{where}: num_tokens {batch.num_tokens} != sum of lengths {sum(batch.lengths)}")
        if batch.num_tokens > coef.capacity_tokens:
            violations.append(f"{where}: {batch.num_tokens} tokens exceed capacity {coef.capacity_tokens}")
        squares = float(sum(length * length for length in batch.lengths))
        stage_time_s = coef.stage_time_s(squares, float(sum(batch.lengths)))
        if not _close(stage_time_s, batch.stage_time_s):
            violations.append(f"{where}: stage time {batch.stage_time_s} != recomputed {stage_time_s}")
        stage_times.append(stage_time_s)
    time_s = simulate_1f1b(stage_times, scheme.pp, coef.fwd_fraction)
    if not _close(time_s, pipeline.time_s):
        violations.append(f"{label}: time {pipeline.time_s} != simulated 1F1B {time_s}")
    num_tokens = sum(batch.num_tokens for batch in pipeline.micro_batches)
    if num_tokens != pipeline.num_tokens:
        violations.append(f"{label}: num_tokens {pipeline.num_tokens} != {num_tokens}")
    num_sequences = len({sid for batch in pipeline.micro_batches for sid in batch.sequence_ids})
    if num_sequences != pipeline.num_sequences:
        violations.append(f"{label}: num_sequences {pipeline.num_sequences} != {num_sequences}")
    return violations, time_s


def _check_totals(plan: Plan, cost: ProfileCostModel, pipeline_times: list[float]) -> list[str]:
    violations = []
    schemes = _schemes(plan)
    strategy = str(Strategy.of([(scheme, 1) for scheme in schemes]))
    if plan.strategy != strategy:
        violations.append(f"strategy {plan.strategy!r} does not match the pipelines ({strategy!r})")
    grad_sync_s = cost.grad_sync_s(schemes)
    if not _close(grad_sync_s, plan.grad_sync_s):
        violations.append(f"grad_sync_s {plan.grad_sync_s} != recomputed {grad_sync_s}")
    step_time_s = max(pipeline_times) + grad_sync_s
    if not _close(step_time_s, plan.step_time_s):
        violations.append(f"step_time_s {plan.step_time_s} != recomputed {step_time_s}")
    previous = parse_strategy(plan.previous_strategy) if plan.previous_strategy else None
    pipelines = [(scheme, tuple(p.ranks)) for scheme, p in zip(schemes, plan.pipelines)]
    switch_s = switch_cost_s(previous, pipelines, cost)
    if not _close(switch_s, plan.switch_cost_s):
        violations.append(f"switch_cost_s {plan.switch_cost_s} != recomputed {switch_s}")
    objective_s = step_time_s + switch_s
    if not _close(objective_s, plan.objective_s):
        violations.append(f"objective_s {plan.objective_s} != step time + switch cost {objective_s}")
    if not 0 <= plan.lower_bound_s <= plan.objective_s * (1 + RELATIVE_TOLERANCE):
        violations.append(f"lower_bound_s {plan.lower_bound_s} is not within [0, objective_s]")
    gap = (plan.objective_s - plan.lower_bound_s) / plan.objective_s if plan.objective_s > 0 else 0.0
    if not math.isclose(gap, plan.gap, abs_tol=1e-9):
        violations.append(f"gap {plan.gap} != (objective - bound) / objective = {gap}")
    return violations
