"""Assembling the boundary `Plan` from a solver candidate: ranks, micro-batches, bound, status."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from hydraplan.planner.candidate import Candidate
from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.items import Items
from hydraplan.planner.packing import PackedPipeline
from hydraplan.planner.schemas import (
    BoundCertificate,
    CostProfile,
    MicroBatch,
    PipelinePlan,
    Plan,
    PlanRequest,
    SchemeModel,
    SolverStats,
    SolveStatus,
)
from hydraplan.planner.slowdowns import effective_slowdowns
from hydraplan.planner.strategies import Placement, place_pipelines


def _digest(content: dict) -> str:
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def request_hash(request: PlanRequest, profile: CostProfile) -> str:
    """Content hash of the canonical request and profile: what a plan was made for."""
    return "rq-" + _digest({"request": request.model_dump(mode="json"), "profile": profile.model_dump(mode="json")})


def identified(plan: Plan) -> Plan:
    """The plan with `plan_id` set to the hash of everything else in it: equal ids, equal plans
    (call again after any change to a plan). `session_feedback` and `bound_certificate` count only
    when set, so plans made without them have the ids they had before the fields existed."""
    excluded = {"plan_id"} | {name for name in ("session_feedback", "bound_certificate") if getattr(plan, name) is None}
    return plan.model_copy(update={"plan_id": "hp-" + _digest(plan.model_dump(mode="json", exclude=excluded))})


def build_plan(
    request: PlanRequest,
    profile: CostProfile,
    items: Items,
    candidate: Candidate,
    lower_bound_s: float,
    stats: SolverStats,
    timed_out: bool,
    certificate: BoundCertificate | None = None,
) -> Plan:
    """Turn a solver candidate into the boundary `Plan` (ranks, micro-batches, bound, status).

    Status: `timeout_incumbent` when `timed_out` (the clock or a cancel cut the search; also
    `solver.cut_by_clock`), even with a gap within tolerance: another run may give another plan,
    so it is never called `optimal`; else `optimal` when the gap is within `gap_tolerance`, or
    `feasible`."""
    step_time_s = candidate.step_time_s
    objective_s = candidate.objective_s
    # the bound the search proved, uncapped: one above the objective is a bug the checker reports
    gap = (objective_s - lower_bound_s) / objective_s if objective_s > 0 else 0.0
    if timed_out:
        status = SolveStatus.TIMEOUT_INCUMBENT
    else:
        status = SolveStatus.OPTIMAL if gap <= request.options.gap_tolerance else SolveStatus.FEASIBLE
    for coef, packed in zip(candidate.coefs, candidate.packed):
        if not math.isfinite(packed.time_s):  # only an interleaved pipeline's refused count is priced so
            raise PlanningError(
                f"a {coef.scheme} pipeline got {sum(len(batch) for batch in packed.micro_batches)} sequences: "
                f"interleaved 1F1B needs a multiple of pp {coef.scheme.pp} micro-batches, at least pp"
            )
    placements = place_pipelines(candidate.strategy.pipeline_schemes())
    # the factors the candidate's coefficients were scaled by (`planner.slowdowns`)
    slow_ranks = effective_slowdowns(request.rank_slowdowns)
    pipelines = [
        _pipeline_plan(index, coef, packed, placement, items, slow_ranks)
        for index, (coef, packed, placement) in enumerate(zip(candidate.coefs, candidate.packed, placements))
    ]
    used = {coef.scheme for coef in candidate.coefs}
    used_profile = profile.model_copy(update={"schemes": [entry for entry in profile.schemes if entry.scheme in used]})
    plan = Plan(
        plan_id="",
        request_hash=request_hash(request, profile),
        status=status,
        strategy=str(candidate.strategy),
        num_gpus=request.num_gpus,
        gpus_per_node=request.gpus_per_node,
        step_time_s=step_time_s,
        grad_sync_s=candidate.grad_sync_s,
        previous_strategy=request.previous_strategy,
        switch_cost_s=candidate.switch_cost_s,
        objective_s=objective_s,
        lower_bound_s=lower_bound_s,
        gap=gap,
        input_lengths=list(request.lengths),
        dropped_sequence_ids=list(items.dropped_sequence_ids),
        split_sequence_ids=list(items.split_sequence_ids),
        pipelines=pipelines,
        cost_profile=used_profile,
        solver=stats.model_copy(update={"cut_by_clock": timed_out, "gap_tolerance": request.options.gap_tolerance}),
        rank_slowdowns=slow_ranks or None,
        bound_certificate=certificate,
    )
    return identified(plan)


def _pipeline_plan(
    index: int,
    coef: SchemeCoefficients,
    packed: PackedPipeline,
    placement: Placement,
    items: Items,
    slow_ranks: dict[int, float],
) -> PipelinePlan:
    # every micro-batch's items in index order, gathered for the whole pipeline at once (thousands
    # of micro-batches per plan at scale), then cut at the micro-batches' boundaries
    sizes = [len(members) for members in packed.micro_batches]
    ends = np.cumsum(sizes, dtype=np.int64)
    starts = ends - sizes
    members = np.concatenate([np.zeros(0, dtype=np.int64), *packed.micro_batches])
    members = members[np.lexsort((members, np.repeat(np.arange(len(sizes)), sizes)))]
    lengths = items.lengths[members]
    running = np.concatenate([[0], np.cumsum(lengths)])
    tokens = (running[ends] - running[starts]).tolist()
    sequence_ids, all_lengths, offsets = (
        items.sequence_ids[members].tolist(),
        lengths.tolist(),
        items.offsets[members].tolist(),
    )
    micro_batches = []
    for start, end, num_tokens, stage_time_s in zip(starts.tolist(), ends.tolist(), tokens, packed.stage_times_s):
        # built from the solver's own arrays (plain ints and a finite float), not validated field
        # by field: thousands per plan at scale; `check_plan` checks the content of every one
        micro_batches.append(
            MicroBatch.model_construct(
                sequence_ids=sequence_ids[start:end],
                lengths=all_lengths[start:end],
                offsets=offsets[start:end],
                num_tokens=int(num_tokens),
                stage_time_s=float(stage_time_s),
            )
        )
    scheme = coef.scheme
    return PipelinePlan(
        index=index,
        scheme=SchemeModel(tp=scheme.tp, pp=scheme.pp, cp=scheme.cp, v=scheme.v),
        ranks=placement.ranks,
        stage_ranks=placement.stage_ranks,
        capacity_tokens=coef.capacity_tokens,
        num_sequences=len(set(sequence_ids)),
        num_tokens=sum(batch.num_tokens for batch in micro_batches),
        time_s=packed.time_s,
        micro_batches=micro_batches,
        slowdown=max((slow_ranks[rank] for rank in placement.ranks if rank in slow_ranks), default=None),
    )
