"""The timeline of a plan: every pipeline's simulated 1F1B schedule, as data.

A plan records each micro-batch's stage time; `planner.simulate.schedule_1f1b` (the simulator the
planner itself uses) turns those into forward and backward blocks per stage. This module chooses
what a reader can take in at once and records it in one document, `hydraplan.timeline/1`, that
the SVG, HTML and PNG drawings (`api.render.svg`, `api.render.png`) render and embed, and that
`POST /v1/plans/timeline` returns:

- pipelines with the same scheme and the same stage times run the same schedule: they are one
  group, drawn once and labelled with every member's index;
- past `max_groups` groups, the slowest groups are drawn and the other pipelines' times are
  summarised in a histogram on the same time axis;
- `pipelines="all"` draws every pipeline on its own row.

Several plans (hydraplan's and the baselines') share one time axis: the longest step sets it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hydraplan.planner.schemas import PipelinePlan, Plan
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.simulate import schedule_1f1b, schedule_interleaved_1f1b

TIMELINE_SCHEMA_VERSION = "hydraplan.timeline/1"
DEFAULT_FWD_FRACTION = 1.0 / 3.0  # the profile format's default, for a scheme missing from the plan's profile
MAX_GROUPS = 8  # groups drawn per plan unless every pipeline is asked for
HISTOGRAM_BINS = 20
# Most blocks one document draws (~300 bytes of SVG each): a drawing stays under ~60 MB.
MAX_DRAWN_BLOCKS = 200_000
PipelineSelection = Literal["grouped", "all"]

# One block: [stage, micro-batch (execution order), "F" or "B", start_s, end_s].
Block = tuple[int, int, Literal["F", "B"], float, float]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PipelineGroup(_Frozen):
    """Pipelines that run one schedule (the same scheme and stage times), drawn once."""

    pipelines: list[int] = Field(description="Indices of the plan's pipelines in this group.")
    scheme: str = Field(description="Their scheme, e.g. <4,2,1>.")
    num_stages: int = Field(description="PP stages: rows of the drawing.")
    num_micro_batches: int
    num_tokens: int = Field(description="Tokens of the first member (members may hold other sequences).")
    time_s: float = Field(description="Simulated 1F1B time of the schedule.")
    blocks: list[Block] = Field(description="[stage, micro_batch, 'F'|'B', start_s, end_s] per block.")


class Histogram(_Frozen):
    """Pipeline times of the pipelines not drawn, in equal bins."""

    edges_s: list[float] = Field(description="Bin edges, one more than counts.")
    counts: list[int]


class PlanTimeline(_Frozen):
    """One plan's schedule: the drawn groups, the marks, and what was left out."""

    label: str = Field(description="hydraplan, or the baseline's name.")
    plan_id: str
    strategy: str
    num_pipelines: int
    step_time_s: float
    grad_sync_s: float = Field(description="Drawn after the slowest pipeline ends.")
    lower_bound_s: float | None = Field(description="The plan's bound (None for a baseline: it has none).")
    slowest_pipeline: int = Field(description="Index of the pipeline that sets the step time.")
    groups: list[PipelineGroup]
    hidden_pipelines: list[int] = Field(description="Pipelines not drawn (their times are in the histogram).")
    histogram: Histogram | None = None


class TimelineDocument(_Frozen):
    """The data every drawing of a timeline embeds; `time_max_s` is the shared axis' end."""

    schema_version: Literal["hydraplan.timeline/1"] = TIMELINE_SCHEMA_VERSION
    time_max_s: float
    plans: list[PlanTimeline]


def timeline_document(
    labelled_plans: Sequence[tuple[str, Plan]],
    pipelines: PipelineSelection = "grouped",
    max_groups: int = MAX_GROUPS,
    lower_bounds: Sequence[bool] | None = None,
) -> TimelineDocument:
    """The timeline of each `(label, plan)`, on one axis. `lower_bounds[i]` says whether plan i's
    `lower_bound_s` is drawn (default: only the first plan's, hydraplan's own)."""
    if not labelled_plans:
        raise ValueError("a timeline needs at least one plan")
    with_bound = list(lower_bounds) if lower_bounds is not None else [i == 0 for i in range(len(labelled_plans))]
    timelines = [
        plan_timeline(label, plan, pipelines, max_groups, bound)
        for (label, plan), bound in zip(labelled_plans, with_bound, strict=True)
    ]
    _check_size(labelled_plans, timelines)
    time_max_s = max(max(timeline.step_time_s, timeline.lower_bound_s or 0.0) for timeline in timelines)
    return TimelineDocument(time_max_s=time_max_s, plans=timelines)


def _check_size(labelled_plans: Sequence[tuple[str, Plan]], timelines: Sequence[PlanTimeline]) -> None:
    num_blocks = sum(len(group.blocks) for timeline in timelines for group in timeline.groups)
    if num_blocks > MAX_DRAWN_BLOCKS:
        raise ValueError(
            f"the timeline of {', '.join(label for label, _ in labelled_plans)} would draw {num_blocks:,} blocks, "
            f"more than the limit of {MAX_DRAWN_BLOCKS:,}; draw fewer pipelines (grouped) or fewer plans"
        )


def plan_timeline(
    label: str, plan: Plan, pipelines: PipelineSelection = "grouped", max_groups: int = MAX_GROUPS, bound: bool = True
) -> PlanTimeline:
    """One plan's timeline: groups of identical schedules, the slowest first past `max_groups`."""
    if not plan.pipelines:
        raise ValueError(f"plan {plan.plan_id} has no pipelines to draw")
    fractions = _fwd_fractions(plan)
    members = _identical_pipelines(plan.pipelines) if pipelines == "grouped" else [[p] for p in plan.pipelines]
    # slowest first, ties by the first member's index, so the drawing is deterministic
    members.sort(key=lambda group: (-group[0].time_s, group[0].index))
    drawn = members if pipelines == "all" else members[:max_groups]
    hidden = [pipeline for group in members[len(drawn) :] for pipeline in group]
    num_blocks = sum(2 * group[0].scheme.pp * len(group[0].micro_batches) for group in drawn)
    if num_blocks > MAX_DRAWN_BLOCKS:  # refused before any block is built
        raise ValueError(
            f"the timeline of {label} would draw {num_blocks:,} blocks, more than the limit of "
            f"{MAX_DRAWN_BLOCKS:,}; draw fewer pipelines (grouped)"
        )
    slowest = max(plan.pipelines, key=lambda pipeline: (pipeline.time_s, -pipeline.index))
    return PlanTimeline(
        label=label,
        plan_id=plan.plan_id,
        strategy=plan.strategy,
        num_pipelines=len(plan.pipelines),
        step_time_s=plan.step_time_s,
        grad_sync_s=plan.grad_sync_s,
        lower_bound_s=plan.lower_bound_s if bound else None,
        slowest_pipeline=slowest.index,
        groups=[_group(group, fractions) for group in drawn],
        hidden_pipelines=sorted(pipeline.index for pipeline in hidden),
        histogram=_histogram([pipeline.time_s for pipeline in hidden]) if hidden else None,
    )


def _fwd_fractions(plan: Plan) -> dict[ParallelScheme, float]:
    """The forward share of each scheme's stage time, from the plan's own cost profile."""
    return {entry.scheme: entry.fwd_fraction for entry in plan.cost_profile.schemes}


def _scheme(pipeline: PipelinePlan) -> ParallelScheme:
    return pipeline.scheme.scheme


def _identical_pipelines(pipelines: Sequence[PipelinePlan]) -> list[list[PipelinePlan]]:
    """Pipelines keyed by (scheme, stage times): equal keys run equal schedules."""
    groups: dict[tuple[ParallelScheme, tuple[float, ...]], list[PipelinePlan]] = {}
    for pipeline in pipelines:
        key = (_scheme(pipeline), tuple(batch.stage_time_s for batch in pipeline.micro_batches))
        groups.setdefault(key, []).append(pipeline)
    return list(groups.values())


def _group(members: Sequence[PipelinePlan], fractions: dict[ParallelScheme, float]) -> PipelineGroup:
    first = members[0]
    scheme = _scheme(first)
    fraction = fractions.get(scheme, DEFAULT_FWD_FRACTION)
    times = [batch.stage_time_s for batch in first.micro_batches]
    if scheme.v > 1:  # one block per chunk operation, on its rank
        schedule = schedule_interleaved_1f1b(times, scheme.pp, scheme.v, fraction, scheme.pp)
    else:
        schedule = schedule_1f1b(times, scheme.pp, fraction)
    blocks: list[Block] = [
        (block.stage, block.micro_batch, "F" if block.is_forward else "B", block.start_s, block.end_s)
        for block in schedule
    ]
    return PipelineGroup(
        pipelines=[pipeline.index for pipeline in members],
        scheme=str(scheme),
        num_stages=scheme.pp,
        num_micro_batches=len(first.micro_batches),
        num_tokens=first.num_tokens,
        time_s=first.time_s,
        blocks=blocks,
    )


def _histogram(times_s: Sequence[float], num_bins: int = HISTOGRAM_BINS) -> Histogram:
    """Equal-width bins over [min, max] of `times_s` (one bin when they are all equal)."""
    low, high = min(times_s), max(times_s)
    if high <= low:
        return Histogram(edges_s=[low, high], counts=[len(times_s)])
    width = (high - low) / num_bins
    counts = [0] * num_bins
    for time_s in times_s:
        counts[min(int((time_s - low) / width), num_bins - 1)] += 1
    return Histogram(edges_s=[low + width * index for index in range(num_bins)] + [high], counts=counts)
