"""The sweep engine: one configuration's seeded steps planned and summarised into a `WhatifRow`.

`evaluate` is the one implementation behind every front door: the CLI's executors call
`evaluate_row` in worker processes or Ray tasks, and the REST sweep job calls `evaluate` with the
service's own solve (its cancel flag, its metrics, its cached profiles). A configuration that
cannot be planned (the model does not fit, a sequence longer than every capacity) is a row with
its reason, never a failed sweep.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hydraplan.api.whatif.measures import (
    geometric_mean,
    model_flops,
    strategy_mix,
    worst_status,
)
from hydraplan.api.whatif.schemas import Configuration, DatasetKind, RowStatus, WhatifRow, is_hydraplan
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest
from hydraplan.planner.scheme import ParallelScheme

# solve(request, profile, baselines) -> checked plan with its `baselines` filled
SolveStep = Callable[[PlanRequest, CostProfile, Sequence[str]], Plan]
ProfileFor = Callable[[Configuration], CostProfile]


@dataclass
class Outcome:
    """A configuration's row, the plans of its steps, and the refusal that stopped it (if any)."""

    row: WhatifRow
    plans: list[Plan] = field(default_factory=list)
    error: Exception | None = None


def evaluate_row(index: int, configuration: Configuration) -> WhatifRow:
    """The row of one configuration with the planner called directly (the executors' task)."""
    return evaluate(index, configuration).row


def evaluate(
    index: int,
    configuration: Configuration,
    solve_step: SolveStep | None = None,
    profile_for: ProfileFor | None = None,
    refusals: tuple[type[Exception], ...] = (ValueError,),
) -> Outcome:
    """Plan every step of `configuration` and summarise them; a refusal becomes a failed row.

    `solve_step` and `profile_for` default to the planner's `solve` and the analytic model (or
    the configuration's profile); `refusals` are the exceptions that mean "cannot be planned".
    """
    solve_step = solve_step or _solve_directly
    profile_for = profile_for or configuration_profile
    base = _identity(index, configuration)
    try:
        profile = profile_for(configuration)
    except refusals as exc:
        return Outcome(_failed(base, f"cost profile: {_one_line(exc)}"), error=exc)
    memory = memory_study(profile, configuration.num_gpus)
    plans: list[Plan] = []
    for step, seed in enumerate(configuration.seeds):
        try:
            plans.append(_plan_step(configuration, profile, seed, solve_step))
        except refusals as exc:
            reason = f"step {step} (seed {seed}): {_one_line(exc)}"
            return Outcome(_failed({**base, **memory}, reason), plans, exc)
    return Outcome(summarise(base, memory, configuration, plans), plans)


def configuration_profile(configuration: Configuration) -> CostProfile:
    """The configuration's profile file, else the analytic profile of its model on its GPUs."""
    if configuration.cost_source.profile is not None:
        return configuration.cost_source.profile
    from hydraplan.cost_models.analytic import build_profile
    from hydraplan.planner.baselines import recipe_counts_for, wants_interleaved

    assert configuration.model is not None and configuration.gpu is not None  # spec expansion ensures it
    model = configuration.model
    counts = (  # megatron-vpp, wlb-vpp compared or planning: their recipe's interleaved schemes priced
        recipe_counts_for(model.name, model.num_layers, configuration.num_gpus)
        if wants_interleaved([*configuration.compare, configuration.planner])
        else []
    )
    return build_profile(
        model, configuration.gpu, configuration.num_gpus, configuration.gpus_per_node, virtual_stages=counts
    )


def step_lengths(configuration: Configuration, seed: int) -> list[int]:
    """The batch of one step: sampled with `seed`, or the exact batch, split at the context cap."""
    from hydraplan.api.datasets import sample_batch, sample_from_lengths, split_at_cap

    dataset, cap = configuration.dataset, configuration.context_cap
    if dataset.kind == DatasetKind.BATCH:
        assert dataset.lengths is not None
        lengths = list(dataset.lengths)
        return lengths if cap is None else split_at_cap(lengths, cap)
    assert configuration.tokens_per_step is not None
    if dataset.kind == DatasetKind.LENGTHS:
        assert dataset.lengths is not None
        return sample_from_lengths(dataset.lengths, configuration.tokens_per_step, seed, cap)
    assert dataset.name is not None
    return sample_batch(dataset.name, configuration.tokens_per_step, seed, cap)


def step_request(configuration: Configuration, seed: int) -> PlanRequest:
    """The planner's request for one step (the solver seed is the step's seed)."""
    return PlanRequest(
        lengths=step_lengths(configuration, seed),
        num_gpus=configuration.num_gpus,
        gpus_per_node=configuration.gpus_per_node,
        options=configuration.options.model_copy(update={"seed": seed}),
        previous_strategy=configuration.previous_strategy,
    )


def _plan_step(configuration: Configuration, profile: CostProfile, seed: int, solve_step: SolveStep) -> Plan:
    request = step_request(configuration, seed)
    if is_hydraplan(configuration.planner):
        return solve_step(request, profile, configuration.compare)
    from hydraplan.planner.baselines import run_baseline

    return run_baseline(configuration.planner, request, profile)


def _solve_directly(request: PlanRequest, profile: CostProfile, baselines: Sequence[str]) -> Plan:
    from hydraplan.planner.solve import solve

    return solve(request, profile, baselines=tuple(baselines))


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


def _identity(index: int, configuration: Configuration) -> dict:
    return {
        "index": index,
        "key": configuration.key(),
        "model": configuration.model_name,
        "gpu": configuration.gpu_name,
        "num_gpus": configuration.num_gpus,
        "gpus_per_node": configuration.gpus_per_node,
        "dataset": configuration.dataset.label,
        "context_cap": configuration.context_cap,
        "tokens_per_step": configuration.tokens_per_step,
        "cost_source": configuration.cost_source.label,
        "planner": configuration.planner,
        "num_steps": len(configuration.seeds),
    }


def _failed(fields: dict, reason: str) -> WhatifRow:
    return WhatifRow(**fields, status=RowStatus.FAILED, reason=reason)


def _one_line(exc: Exception) -> str:
    detail = getattr(exc, "detail", None)  # the service's ProblemError
    return " ".join(str(detail if isinstance(detail, str) else exc).split())


def memory_study(profile: CostProfile, num_gpus: int) -> dict:
    """The longest sequence each runnable scheme holds (its capacity), and over the schemes the
    longest some scheme holds and the longest every scheme holds."""
    from hydraplan.planner.cost import ProfileCostModel

    cost = ProfileCostModel(profile)
    capacities = {
        str(scheme): cost.capacity_tokens(scheme)
        for scheme in sorted(cost.schemes(), key=_scheme_order)
        if scheme.num_gpus <= num_gpus
    }
    if not capacities:
        return {}
    return {
        "scheme_capacity_tokens": capacities,
        "max_context_any_scheme_tokens": max(capacities.values()),
        "max_context_every_scheme_tokens": min(capacities.values()),
    }


def _scheme_order(scheme: ParallelScheme) -> tuple[int, int, int]:
    return (scheme.tp, scheme.pp, scheme.cp)


def summarise(base: dict, memory: dict, configuration: Configuration, plans: Sequence[Plan]) -> WhatifRow:
    """The row of a configuration whose every step was planned."""
    step_times = [plan.step_time_s for plan in plans]
    tokens = [sum(pipeline.num_tokens for pipeline in plan.pipelines) for plan in plans]
    total_time_s = sum(step_times)
    tokens_per_s = sum(tokens) / total_time_s
    mfu = None
    if configuration.model is not None and configuration.gpu is not None:
        flops = sum(model_flops(configuration.model, plan) for plan in plans)
        mfu = flops / (total_time_s * configuration.num_gpus * configuration.gpu.peak_bf16_flops)
    speedups, errors = _speedups(plans)
    return WhatifRow(
        **base,
        **memory,
        status=RowStatus.OK,
        mean_tokens=sum(tokens) / len(tokens),
        step_time_s=total_time_s / len(plans),
        step_times_s=step_times,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / configuration.num_gpus,
        mfu=mfu,
        gap=max(plan.gap for plan in plans),
        plan_status=worst_status([str(plan.status) for plan in plans]),
        strategy=Counter(plan.strategy for plan in plans).most_common(1)[0][0],
        strategy_mix=strategy_mix(plans, configuration.num_gpus),
        speedups=speedups,
        baseline_errors=errors,
    )


def _speedups(plans: Sequence[Plan]) -> tuple[dict[str, float], dict[str, str]]:
    """Per compared baseline, the geometric mean speedup over the steps, or its first error."""
    per_name: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    for plan in plans:
        for result in plan.baselines:
            if result.speedup is None:
                errors.setdefault(result.name, result.error or "no result")
            else:
                per_name.setdefault(result.name, []).append(result.speedup)
    speedups = {
        name: geometric_mean(values)
        for name, values in per_name.items()
        if name not in errors and len(values) == len(plans)
    }
    return speedups, errors
