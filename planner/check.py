"""The independent plan checker: the specification every plan must meet.

It recomputes everything from the plan's inputs and the cost profile, trusting nothing the solver
reported and sharing none of its code: costs, capacities, the 1F1B simulation, the gradient sync
and the switch cost come from `planner.reference`, written apart from the solver. It checks
sequence coverage (every sequence placed exactly once, split only when longer than every
capacity, dropped only then too), capacities, the rank layout, the slow ranks' factors (a
pipeline's stage times scaled by the largest `rank_slowdowns` factor among its ranks), the
cluster layout (whole nodes;
every TP group, and every TP x CP grid that fits a node, inside one), stage times, pipeline times,
the gradient sync, the step time, the switch cost, the bound (at most the objective), the gap, the
status, the `plan_id` and, given the request, that the plan answers it (its `request_hash` too
when the profile is given).

The two content hashes are recomputed here from their definition (docs/planner.md, "The plan
JSON"), not by the planner's `build` module: every plan the planner returns passes this checker,
so the planner's hashing is held to this definition on every plan it makes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from typing import Any

from hydraplan.planner import reference
from hydraplan.planner.schemas import CostProfile, PipelinePlan, Plan, PlanRequest, SolverOptions, SolveStatus

RELATIVE_TOLERANCE = 1e-6


def check_plan(plan: Plan, profile: CostProfile | None = None, request: PlanRequest | None = None) -> list[str]:
    """Every violation found (empty when the plan is valid).

    Costs are recomputed from `profile` when given (it must contain every scheme the plan uses),
    else from the profile embedded in the plan. With `request`, the plan must answer it: its
    lengths, cluster and previous strategy, a status decided by its `gap_tolerance` and, when
    `profile` is given too (the whole profile it was planned with: the plan embeds only the
    schemes it uses), a `request_hash` equal to the hash of the two.
    """
    costs = profile or plan.cost_profile
    violations = _check_ranks(plan)
    violations += _check_nodes(plan)
    violations += _check_coverage(plan, costs)
    violations += _check_slowdown_factors(plan)
    pipeline_times = []
    for pipeline in plan.pipelines:
        pipeline_violations, time_s = _check_pipeline(pipeline, costs, _slowdown_of(plan, pipeline))
        violations += pipeline_violations
        pipeline_times.append(time_s)
    if not violations:  # the totals are recomputed from consistent pipelines only
        violations = _check_totals(plan, costs, pipeline_times)
    return violations + _check_claims(plan, profile, request)


def _close(left: float, right: float) -> bool:
    return math.isclose(left, right, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)


def _scheme(pipeline: PipelinePlan) -> reference.Scheme:
    return reference.short_scheme(pipeline.scheme.tp, pipeline.scheme.pp, pipeline.scheme.cp, pipeline.scheme.v)


def _label(pipeline: PipelinePlan) -> str:
    return f"pipeline {pipeline.index} <{','.join(map(str, _scheme(pipeline)))}>"


def _check_ranks(plan: Plan) -> list[str]:
    violations = []
    if not plan.pipelines:
        return ["plan has no pipelines"]
    seen: set[int] = set()
    for pipeline in plan.pipelines:
        tp, pp, cp, _ = reference.full_scheme(_scheme(pipeline))
        label = _label(pipeline)
        if len(pipeline.ranks) != tp * pp * cp:
            violations.append(f"{label}: {len(pipeline.ranks)} ranks, scheme needs {tp * pp * cp}")
        if len(pipeline.stage_ranks) != pp or any(len(stage) != tp * cp for stage in pipeline.stage_ranks):
            violations.append(f"{label}: stage_ranks must be {pp} lists of {tp * cp} ranks")
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


def _check_nodes(plan: Plan) -> list[str]:
    """The cluster rules the planner places by (`PlanRequest`, `strategies.place_pipelines`,
    DESIGN.md): the GPUs are whole nodes of `gpus_per_node` (or part of one node); every TP group
    is inside one node; every stage's TP x CP grid is inside one node when it is no larger than a
    node (the analytic model prices its CP ring at NVLink latency then). Rank r is on node
    r // gpus_per_node. A grid or a pipeline larger than a node may span nodes, and a pipeline
    need not start on a node boundary: the placement promises neither."""
    per_node = plan.gpus_per_node
    if plan.num_gpus > per_node and plan.num_gpus % per_node:
        return [f"gpus_per_node {per_node}: num_gpus {plan.num_gpus} is not a whole number of nodes"]
    violations = []
    for pipeline in plan.pipelines:
        tp, _, cp, _ = reference.full_scheme(_scheme(pipeline))
        for stage in pipeline.stage_ranks:  # a stage's ranks are its TP x CP grid, TP innermost
            groups = [stage[start : start + tp] for start in range(0, len(stage), tp)]
            if stage and tp * cp <= per_node:
                groups.append(stage)  # after its TP groups: a TP group that spans nodes is named first
            spanning = next((group for group in groups if _nodes(group, per_node)), None)
            if spanning is not None:
                first, last = _nodes(spanning, per_node)
                kind = "TP x CP grid" if spanning is stage else "TP group"
                violations.append(
                    f"{_label(pipeline)}: {kind} of ranks {spanning} spans nodes {first} to {last} "
                    f"(gpus_per_node {per_node})"
                )
                break
    return violations


def _nodes(group: list[int], per_node: int) -> tuple[int, int] | None:
    """The first and last node of a group of ranks that spans nodes; None when it is in one."""
    first, last = min(group) // per_node, max(group) // per_node
    return (first, last) if first != last else None


def _check_coverage(plan: Plan, profile: CostProfile) -> list[str]:
    """Every input sequence tiled exactly once by its chunks, unless listed as dropped; only a
    sequence longer than every scheme's capacity may be split or dropped (the oversize policy)."""
    violations = []
    largest_capacity = max(reference.capacity_tokens(profile, entry) for entry in profile.schemes)
    chunks: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for pipeline in plan.pipelines:
        for batch in pipeline.micro_batches:
            for sequence_id, offset, length in zip(batch.sequence_ids, batch.offsets, batch.lengths):
                chunks[sequence_id].append((offset, length))
    dropped = set(plan.dropped_sequence_ids)
    split = set(plan.split_sequence_ids)
    for sequence_id in sorted(dropped | split):
        if not 0 <= sequence_id < len(plan.input_lengths):
            violations.append(f"sequence {sequence_id} is listed as dropped or split but is no input sequence")
        elif plan.input_lengths[sequence_id] <= largest_capacity:
            kind = "dropped" if sequence_id in dropped else "split"
            violations.append(
                f"sequence {sequence_id} ({plan.input_lengths[sequence_id]} tokens) is {kind} though it fits "
                f"the largest capacity, {largest_capacity} tokens"
            )
    if dropped & split:
        violations.append(f"sequences listed as both dropped and split: {sorted(dropped & split)[:5]}")
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


def _slowdown_of(plan: Plan, pipeline: PipelinePlan) -> float:
    """The factor a pipeline's stage times carry: a pipeline runs at its slowest rank's pace, so the
    largest of the plan's `rank_slowdowns` over its ranks (1 when it holds no slow rank)."""
    factors = plan.rank_slowdowns or {}
    return max([1.0, *(factors[rank] for rank in pipeline.ranks if rank in factors)])


def _check_slowdown_factors(plan: Plan) -> list[str]:
    """`rank_slowdowns` names ranks of the plan with finite factors above 1, and every pipeline's
    `slowdown` is the largest of them over its ranks (absent when it holds none)."""
    violations = []
    for rank, factor in (plan.rank_slowdowns or {}).items():
        if not 0 <= rank < plan.num_gpus:
            violations.append(f"rank_slowdowns: rank {rank} is not a rank of the {plan.num_gpus} GPUs")
        if not (math.isfinite(factor) and factor > 1.0):
            violations.append(f"rank_slowdowns[{rank}] = {factor}: a plan lists only finite factors above 1")
    if violations:
        return violations
    for pipeline in plan.pipelines:
        factor = _slowdown_of(plan, pipeline)
        expected = factor if factor > 1.0 else None
        if pipeline.slowdown != expected:
            violations.append(f"{_label(pipeline)}: slowdown {pipeline.slowdown} != {expected} from rank_slowdowns")
    return violations


def _check_pipeline(pipeline: PipelinePlan, profile: CostProfile, slowdown: float = 1.0) -> tuple[list[str], float]:
    label = _label(pipeline)
    entry = reference.scheme_entries(profile).get(_scheme(pipeline))
    if entry is None:
        return [f"{label}: scheme is not in the cost profile"], 0.0
    capacity = reference.capacity_tokens(profile, entry)
    violations = []
    if not pipeline.micro_batches:
        violations.append(f"{label}: has no micro-batches (idle GPUs)")
    if pipeline.capacity_tokens != capacity:
        violations.append(f"{label}: capacity {pipeline.capacity_tokens} differs from the profile's {capacity}")
    stage_times = []
    for position, batch in enumerate(pipeline.micro_batches):
        where = f"{label} micro-batch {position}"
        if not (len(batch.sequence_ids) == len(batch.lengths) == len(batch.offsets)) or not batch.lengths:
            violations.append(f"{where}: sequence_ids, lengths and offsets must be equal-length and non-empty")
            continue
        if sum(batch.lengths) != batch.num_tokens:
            violations.append(f"{where}: num_tokens {batch.num_tokens} != sum of lengths {sum(batch.lengths)}")
        if sum(batch.lengths) > capacity:
            violations.append(f"{where}: {sum(batch.lengths)} tokens exceed capacity {capacity}")
        stage_time_s = reference.stage_time_s(profile, entry, batch.lengths) * slowdown
        if not _close(stage_time_s, batch.stage_time_s):
            violations.append(f"{where}: stage time {batch.stage_time_s} != recomputed {stage_time_s}")
        stage_times.append(stage_time_s)
    if entry.v == 1:
        time_s = reference.pipeline_time_s(stage_times, entry.pp, entry.fwd_fraction)
    elif len(stage_times) % entry.pp:  # groups of pp (Megatron-Core's default), none cut short
        violations.append(
            f"{label}: {len(stage_times)} micro-batches; interleaved 1F1B with groups of pp {entry.pp} needs a multiple"
        )
        time_s = math.inf
    else:
        time_s = reference.interleaved_pipeline_time_s(stage_times, entry.pp, entry.v, entry.fwd_fraction, entry.pp)
    if not _close(time_s, pipeline.time_s):
        violations.append(f"{label}: time {pipeline.time_s} != simulated {_schedule_name(entry.v)} {time_s}")
    num_tokens = sum(batch.num_tokens for batch in pipeline.micro_batches)
    if num_tokens != pipeline.num_tokens:
        violations.append(f"{label}: num_tokens {pipeline.num_tokens} != {num_tokens}")
    num_sequences = len({sid for batch in pipeline.micro_batches for sid in batch.sequence_ids})
    if num_sequences != pipeline.num_sequences:
        violations.append(f"{label}: num_sequences {pipeline.num_sequences} != {num_sequences}")
    return violations, time_s


def _schedule_name(num_chunks: int) -> str:
    return "1F1B" if num_chunks == 1 else f"interleaved 1F1B (v {num_chunks})"


def _check_previous_size(plan: Plan) -> None:
    """ValueError when the previous strategy does not use the plan's GPUs: its pipelines are placed
    rank by rank to price the switch, so a count like 10000000x<1,1,1> is refused from the text."""
    if plan.previous_strategy is None:
        return
    terms = reference.parse_strategy_text(plan.previous_strategy)
    num_gpus = sum(math.prod(reference.full_scheme(scheme)[:3]) * count for scheme, count in terms)
    if num_gpus != plan.num_gpus:
        raise ValueError(f"{plan.previous_strategy[:80]!r} uses {num_gpus} GPUs, the plan has {plan.num_gpus}")


def _check_totals(plan: Plan, profile: CostProfile, pipeline_times: list[float]) -> list[str]:
    violations = []
    schemes = [_scheme(pipeline) for pipeline in plan.pipelines]
    strategy = reference.canonical_strategy(schemes)
    if plan.strategy != strategy:
        violations.append(f"strategy {plan.strategy!r} does not match the pipelines ({strategy!r})")
    grad_sync_s = reference.grad_sync_s(profile, schemes)
    if not _close(grad_sync_s, plan.grad_sync_s):
        violations.append(f"grad_sync_s {plan.grad_sync_s} != recomputed {grad_sync_s}")
    step_time_s = max(pipeline_times) + grad_sync_s
    if not _close(step_time_s, plan.step_time_s):
        violations.append(f"step_time_s {plan.step_time_s} != recomputed {step_time_s}")
    pipelines = [(scheme, pipeline.ranks) for scheme, pipeline in zip(schemes, plan.pipelines)]
    try:
        _check_previous_size(plan)
        switch_s = reference.switch_cost_s(profile, plan.previous_strategy, pipelines)
    except ValueError as error:
        return [*violations, f"previous_strategy: {error}"]
    if not _close(switch_s, plan.switch_cost_s):
        violations.append(f"switch_cost_s {plan.switch_cost_s} != recomputed {switch_s}")
    objective_s = step_time_s + switch_s
    if not _close(objective_s, plan.objective_s):
        violations.append(f"objective_s {plan.objective_s} != step time + switch cost {objective_s}")
    if not 0 <= plan.lower_bound_s <= plan.objective_s * (1 + RELATIVE_TOLERANCE):
        violations.append(f"lower_bound_s {plan.lower_bound_s} is not within [0, objective_s {plan.objective_s}]")
    gap = (plan.objective_s - plan.lower_bound_s) / plan.objective_s if plan.objective_s > 0 else 0.0
    if not math.isclose(gap, plan.gap, abs_tol=1e-9):
        violations.append(f"gap {plan.gap} != (objective - bound) / objective = {gap}")
    return violations


def _check_claims(plan: Plan, profile: CostProfile | None, request: PlanRequest | None) -> list[str]:
    """The plan's status, its `plan_id` and, given the request, that the plan answers it."""
    violations = _check_status(plan, request)
    try:
        plan_id = content_plan_id(plan)
    except ValueError:  # canonical JSON has no NaN or infinity (a float field that allows them)
        violations.append("plan_id cannot be the hash of the plan's content: it holds NaN or infinity")
    else:
        if plan.plan_id != plan_id:
            violations.append(f"plan_id {plan.plan_id!r} is not the hash of the plan's content, {plan_id!r}")
    if request is not None:
        violations += _check_request(plan, profile, request)
    return violations


def _check_status(plan: Plan, request: PlanRequest | None) -> list[str]:
    """`timeout_incumbent` exactly when the clock cut the search (`solver.cut_by_clock`); else
    `optimal` exactly when the gap is at most the gap tolerance (the planner's rule, `build`): the
    request's when it is given, else the one the plan records (the default for an older plan that
    records none)."""
    cut_by_clock = plan.solver.cut_by_clock
    if (plan.status == SolveStatus.TIMEOUT_INCUMBENT) != cut_by_clock:
        return [
            f"status {plan.status} with solver.cut_by_clock {cut_by_clock}: timeout_incumbent is the status "
            "of a plan the clock cut, and only of one"
        ]
    recorded = plan.solver.gap_tolerance
    violations = []
    if request is not None:
        tolerance = request.options.gap_tolerance
        if recorded is not None and recorded != tolerance:
            violations.append(f"solver.gap_tolerance {recorded} is not the request's gap_tolerance {tolerance}")
    elif recorded is not None:
        tolerance = recorded
    else:
        tolerance = SolverOptions.model_fields["gap_tolerance"].default
    if cut_by_clock:
        return violations
    within = plan.gap <= tolerance
    if (plan.status == SolveStatus.OPTIMAL) != within:
        relation = "at most" if within else "above"
        violations.append(f"status {plan.status} with gap {plan.gap}, {relation} the gap tolerance {tolerance}")
    return violations


def _check_request(plan: Plan, profile: CostProfile | None, request: PlanRequest) -> list[str]:
    """The plan is one of `request`: its batch, cluster and previous strategy; with the profile
    it was planned with, its `request_hash`."""
    violations = []
    if len(request.lengths) != len(plan.input_lengths):
        violations.append(f"plan covers {len(plan.input_lengths)} sequences, the request has {len(request.lengths)}")
    else:
        for index, (asked, planned) in enumerate(zip(request.lengths, plan.input_lengths)):
            if asked != planned:
                violations.append(f"sequence {index}: the plan has length {planned}, the request {asked}")
                break
    for field in ("num_gpus", "gpus_per_node", "previous_strategy"):
        planned, asked = getattr(plan, field), getattr(request, field)
        if planned != asked:
            violations.append(f"{field} {planned!r} is not the request's {asked!r}")
    asked_slow = {rank: factor for rank, factor in (request.rank_slowdowns or {}).items() if factor > 1.0}
    if (plan.rank_slowdowns or {}) != asked_slow:
        violations.append(f"rank_slowdowns {plan.rank_slowdowns} are not the request's factors above 1 ({asked_slow})")
    if profile is not None:
        violations += _check_request_hash(plan, request, profile)
    return violations


def _check_request_hash(plan: Plan, request: PlanRequest, profile: CostProfile) -> list[str]:
    try:
        expected = content_request_hash(request, profile)
    except ValueError:  # canonical JSON has no NaN or infinity (a float field that allows them)
        return ["request_hash cannot be the hash of the request and profile: one holds NaN or infinity"]
    if plan.request_hash != expected:
        return [f"request_hash {plan.request_hash!r} is not the hash of the request and profile, {expected!r}"]
    return []


def content_digest(content: Any) -> str:
    """The format's content hash: SHA-256 of the canonical JSON (sorted keys, no spaces, no NaN),
    its first 20 hex digits."""
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def content_plan_id(plan: Plan) -> str:
    """What `plan_id` must be: `hp-` and the hash of the plan's JSON without `plan_id`, and
    without `session_feedback` and `bound_certificate` where they are null (a plan made without
    them hashes as it did before the fields existed)."""
    excluded = {"plan_id"} | {name for name in ("session_feedback", "bound_certificate") if getattr(plan, name) is None}
    return "hp-" + content_digest(plan.model_dump(mode="json", exclude=excluded))


def content_request_hash(request: PlanRequest, profile: CostProfile) -> str:
    """What `request_hash` must be: `rq-` and the hash of the request's and the whole profile's JSON."""
    request_json, profile_json = request.model_dump(mode="json"), profile.model_dump(mode="json")
    return "rq-" + content_digest({"request": request_json, "profile": profile_json})
