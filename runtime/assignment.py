"""From a `hydraplan.plan/1` file to what each rank executes, checked before any compute.

`validate_plan` refuses, with one line, a plan the runtime must not start: one that fails the
planner's independent checker, one whose rank count differs from the world size, one whose model
the runtime cannot build (unknown to the catalog, or a scheme the model cannot be cut by).
`assign_ranks` gives every global rank its `RankAssignment`: its pipeline, PP stage, TP and CP
rank, the ranks of its TP and CP groups, its neighbours in the pipeline and the micro-batches it
runs, in the plan's execution order (split chunks included, with their offsets).

Rank layout (the plan's `pipelines[].ranks` doc): stage-major, then CP, then TP, so the rank at
position `cp_rank * tp + tp_rank` of `stage_ranks[stage]` holds TP shard `tp_rank` of CP chunk
pair `cp_rank` of that stage. Activations go from a rank to the rank with the same (tp, cp)
position in the next stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydraplan.planner.check import check_plan
from hydraplan.planner.schemas import Plan
from hydraplan.planner.scheme import ParallelScheme

__all__ = [
    "MicroBatchWork",
    "PlanRefusedError",
    "RankAssignment",
    "assign_ranks",
    "global_token_count",
    "interleaved_order",
    "model_config_for",
    "one_f_one_b",
    "validate_plan",
]


class PlanRefusedError(ValueError):
    """The runtime will not execute this plan; the message is one line saying why."""


@dataclass(frozen=True)
class MicroBatchWork:
    """One micro-batch of a pipeline: entry k is `lengths[k]` tokens of sequence `sequence_ids[k]`
    starting at token `offsets[k]` of that sequence (a chunk when the sequence was split)."""

    index: int
    sequence_ids: tuple[int, ...]
    lengths: tuple[int, ...]
    offsets: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


@dataclass(frozen=True)
class RankAssignment:
    """Everything one global rank needs to know about its place in the plan."""

    rank: int
    pipeline_index: int
    scheme: ParallelScheme
    stage: int
    tp_rank: int
    cp_rank: int
    tp_ranks: tuple[int, ...]  # global ranks of this rank's TP group (same stage and CP rank)
    cp_ranks: tuple[int, ...]  # global ranks of this rank's CP group (same stage and TP rank)
    previous_rank: int | None  # same (tp, cp) position, previous stage; None on the first stage
    next_rank: int | None  # same position, next stage; None on the last stage
    micro_batches: tuple[MicroBatchWork, ...]
    # interleaved pipelines (scheme.v > 1) wrap around: the last stage's chunk c feeds the first
    # stage's chunk c + 1, so every rank has a ring neighbour on both sides (itself when pp == 1)
    ring_previous_rank: int = -1
    ring_next_rank: int = -1

    @property
    def num_chunks(self) -> int:
        """Model chunks this rank holds (v; 1 under plain 1F1B)."""
        return self.scheme.v

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.scheme.pp - 1


def one_f_one_b(stage: int, num_stages: int, num_micro_batches: int) -> list[tuple[bool, int]]:
    """The 1F1B order of one stage as (is_forward, micro-batch) pairs: `min(pp - stage - 1, m)`
    warm-up forwards, then one forward and one backward in turn, then the remaining backwards
    (PipeDream-Flush, Narayanan et al. 2021, arXiv 2104.04473): the schedule the planner simulates."""
    num_warmup = min(num_stages - stage - 1, num_micro_batches)
    order = [(True, index) for index in range(num_warmup)]
    for step in range(num_micro_batches - num_warmup):
        order += [(True, num_warmup + step), (False, step)]
    order += [(False, index) for index in range(num_micro_batches - num_warmup, num_micro_batches)]
    return order


def interleaved_order(
    stage: int, num_stages: int, num_chunks: int, num_micro_batches: int
) -> list[tuple[bool, int, int]]:
    """The interleaved 1F1B order of one rank as (is_forward, micro-batch, chunk): Megatron-Core's
    schedule with micro-batches in groups of pp (`forward_backward_pipelining_with_interleaving`,
    Narayanan et al. 2021 §2.2.2), the one the planner simulates (`planner.simulate`, checked equal
    by the tests). The k-th forward of every rank runs entry k of a table that walks each group of
    pp micro-batches through chunk 0, then chunk 1, ... (the last group: whatever remains); the
    k-th backward runs entry k with the chunk mirrored. Rank r first runs `2 (pp - r - 1) + (v - 1)
    pp` forwards (at most all), then one forward and one backward in turn, then the rest."""
    table = []
    for first in range(0, num_micro_batches, num_stages):
        group = range(first, min(first + num_stages, num_micro_batches))
        table += [(index, chunk) for chunk in range(num_chunks) for index in group]
    warmup = min(len(table), 2 * (num_stages - stage - 1) + (num_chunks - 1) * num_stages)
    order = [(True, *table[k]) for k in range(warmup)]
    for k in range(len(table)):
        if k + warmup < len(table):
            order.append((True, *table[k + warmup]))
        index, chunk = table[k]
        order.append((False, index, num_chunks - 1 - chunk))
    return order


def model_config_for(plan: Plan, models_file: str | None = None, **overrides):
    """The `ModelConfig` of the plan's model (`cost_profile.model`, a catalog name).

    Imported lazily: `runtime.model` imports torch, and refusals need none.
    """
    from hydraplan.cost_models.catalog import CatalogError
    from hydraplan.runtime.model import ModelConfig

    name = plan.cost_profile.model
    if not name:
        raise PlanRefusedError("the plan names no model (cost_profile.model is empty): the runtime cannot build it")
    try:
        return ModelConfig.from_catalog(name, models_file, **overrides)
    except CatalogError as exc:
        raise PlanRefusedError(f"the plan's model {name!r} cannot be built: {exc}") from None


def validate_plan(plan: Plan, world_size: int, cfg) -> None:
    """Raise `PlanRefusedError` unless the plan can run on `world_size` ranks with model `cfg`."""
    violations = check_plan(plan)
    if violations:
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise PlanRefusedError(f"the plan fails the checker: {violations[0]}{more}")
    if plan.num_gpus != world_size:
        raise PlanRefusedError(f"the plan has {plan.num_gpus} ranks but the world size is {world_size}")
    if cfg.num_layers != plan.cost_profile.num_layers:
        raise PlanRefusedError(
            f"model {cfg.name!r} has {cfg.num_layers} layers, the plan's cost profile {plan.cost_profile.num_layers}"
        )
    for pipeline in plan.pipelines:
        tp, pp, chunks = pipeline.scheme.tp, pipeline.scheme.pp, pipeline.scheme.v
        label = f"pipeline {pipeline.index} {pipeline.scheme.scheme}"
        if cfg.num_layers % pp:
            raise PlanRefusedError(f"{label}: pp={pp} does not divide the {cfg.num_layers} layers of {cfg.name!r}")
        if cfg.num_layers % (pp * chunks):
            raise PlanRefusedError(
                f"{label}: pp={pp} x v={chunks} chunks do not divide the {cfg.num_layers} layers of {cfg.name!r}"
            )
        if cfg.num_kv_heads % tp:
            raise PlanRefusedError(f"{label}: tp={tp} does not divide the {cfg.num_kv_heads} KV heads of {cfg.name!r}")
        if not pipeline.micro_batches:
            raise PlanRefusedError(f"{label}: has no micro-batch (the runtime needs work on every pipeline)")


def global_token_count(plan: Plan) -> int:
    """Tokens the step's loss is averaged over: every entry of every micro-batch of every pipeline."""
    return sum(batch.num_tokens for pipeline in plan.pipelines for batch in pipeline.micro_batches)


def assign_ranks(plan: Plan) -> list[RankAssignment]:
    """The `RankAssignment` of every global rank, by rank (the plan must be valid)."""
    assignments: dict[int, RankAssignment] = {}
    for pipeline in plan.pipelines:
        scheme = pipeline.scheme.scheme
        works = tuple(
            MicroBatchWork(index, tuple(batch.sequence_ids), tuple(batch.lengths), tuple(batch.offsets))
            for index, batch in enumerate(pipeline.micro_batches)
        )
        for stage, stage_ranks in enumerate(pipeline.stage_ranks):
            for position, rank in enumerate(stage_ranks):
                cp_rank, tp_rank = divmod(position, scheme.tp)
                neighbour = {
                    offset: pipeline.stage_ranks[stage + offset][position]
                    for offset in (-1, 1)
                    if 0 <= stage + offset < scheme.pp
                }
                assignments[rank] = RankAssignment(
                    rank=rank,
                    pipeline_index=pipeline.index,
                    scheme=scheme,
                    stage=stage,
                    tp_rank=tp_rank,
                    cp_rank=cp_rank,
                    tp_ranks=tuple(stage_ranks[cp_rank * scheme.tp : (cp_rank + 1) * scheme.tp]),
                    cp_ranks=tuple(stage_ranks[tp_rank :: scheme.tp]),
                    previous_rank=neighbour.get(-1),
                    next_rank=neighbour.get(1),
                    micro_batches=works,
                    ring_previous_rank=pipeline.stage_ranks[(stage - 1) % scheme.pp][position],
                    ring_next_rank=pipeline.stage_ranks[(stage + 1) % scheme.pp][position],
                )
    return [assignments[rank] for rank in sorted(assignments)]
