"""The memory terms of a micro-batch's longest sequence (issue 31 item 4): `m3 * max(l)^2` and `m4 *
max(l)^2.5`, fitted to real peaks by the profiler's fit, read by the planner's capacity and by the
checker's own."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hydraplan.cost_models.fit import MEMORY_UNMETERED_MARGIN, fit_memory, fit_scheme, memory_features, upper_fit
from hydraplan.planner import reference
from hydraplan.planner.check import check_plan
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.measurements import StageSample
from hydraplan.planner.schemas import (
    CostProfile,
    PlanRequest,
    SchemeCost,
    SolverOptions,
    derive_capacity_tokens,
    most_tokens,
)
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.solve import solve

MIB = 2**20


def entry(m3: float, m4: float = 0.0) -> SchemeCost:
    return SchemeCost(
        tp=1,
        pp=1,
        a=1e-9,
        b=1e-5,
        c=1e-3,
        static_bytes=100 * MIB,
        activation_bytes_per_token=0.1 * MIB,
        activation_bytes_per_token_sq=0.0,
        activation_bytes_per_longest_sq=m3,
        activation_bytes_per_longest_pow=m4,
    )


def profile(m3: float, m4: float = 0.0) -> CostProfile:
    return CostProfile(num_layers=4, gpu_memory_bytes=400 * MIB, schemes=[entry(m3, m4)])


def test_the_planner_and_the_checker_bound_the_longest_square_by_the_capacity_squared() -> None:
    plain, longest = profile(0.0), profile(200.0)
    capacity = derive_capacity_tokens(longest, longest.schemes[0])
    assert capacity == reference.capacity_tokens(longest, longest.schemes[0])
    assert capacity == ProfileCostModel(longest).capacity_tokens(ParallelScheme(1, 1, 1))
    assert capacity < derive_capacity_tokens(plain, plain.schemes[0]) == 3000
    # the bound: one sequence of `capacity` tokens fits, one more token does not
    free = 300 * MIB
    assert 0.1 * MIB * capacity + 200.0 * capacity**2 <= free < 0.1 * MIB * (capacity + 1) + 200.0 * (capacity + 1) ** 2
    # the same term as a sum-of-squares term gives the same capacity (max(l)^2 <= sum(l^2) <= T^2)
    as_square = longest.schemes[0].model_copy(update={"activation_bytes_per_longest_sq": 0.0})
    as_square = as_square.model_copy(update={"activation_bytes_per_token_sq": 200.0})
    assert derive_capacity_tokens(longest, as_square) == capacity


def test_a_plan_made_without_the_term_is_refused_by_the_checker_with_it() -> None:
    lengths = [2500, 400, 300, 200]
    options = SolverOptions(time_limit_s=5, solver="greedy", strategy_pool=["1x<1,1,1>"])
    request = PlanRequest(lengths=lengths, num_gpus=1, options=options)
    plain_plan = solve(request, profile(0.0))
    assert check_plan(plain_plan, profile(0.0)) == []
    found = check_plan(plain_plan, profile(200.0))
    capacity = derive_capacity_tokens(profile(200.0), entry(200.0))
    assert any(f"exceed capacity {capacity}" in violation for violation in found), found
    # planned with the term, every micro-batch keeps to the smaller capacity and the checker agrees
    split = SolverOptions(time_limit_s=5, solver="greedy", strategy_pool=["1x<1,1,1>"], oversize="split")
    planned = solve(PlanRequest(lengths=lengths, num_gpus=1, options=split), profile(200.0))
    assert check_plan(planned, profile(200.0)) == []
    batches = [batch for pipeline in planned.pipelines for batch in pipeline.micro_batches]
    assert max(batch.num_tokens for batch in batches) <= capacity < 2500


def test_a_profile_without_the_term_is_written_as_before() -> None:
    assert "activation_bytes_per_longest_sq" not in json.loads(profile(0.0).model_dump_json())["schemes"][0]
    assert json.loads(profile(5.0).model_dump_json())["schemes"][0]["activation_bytes_per_longest_sq"] == 5.0


def real_peak_samples(shapes: list[list[int]], peak, pp: int = 1) -> list[StageSample]:
    """Stage-0 samples of `shapes` whose real peak is `peak(lengths)` bytes."""
    return [
        StageSample(
            tp=1,
            pp=pp,
            stage=0,
            lengths=lengths,
            time_s=1e-3 * sum(lengths),
            fwd_s=3e-4 * sum(lengths),
            peak_bytes=peak(lengths),
            static_bytes=5e6,
        )
        for lengths in shapes
    ]


def samples_with_longest_term() -> list[StageSample]:
    """Real peaks `1e5 T + 50 max(l)^2 + 2e6` bytes (no sum(l^2) part) on the profiler's mixes."""
    shapes = []
    for tokens in (128, 256, 512, 768):
        shapes += [[tokens], [32] * (tokens // 32), [tokens // 2, *([32] * (tokens // 64))]]
    return real_peak_samples(shapes, lambda lengths: 2e6 + 1e5 * sum(lengths) + 50.0 * max(lengths) ** 2, pp=2)


def test_the_fit_finds_the_longest_term_and_the_capacity_keeps_it() -> None:
    samples = samples_with_longest_term()
    memory = fit_memory(samples)
    m0, m1, m2, m3, m4 = memory.coefficients
    assert m3 > 10 * max(m2, m4, 1e-12)  # the peak grows with the longest sequence, not every sequence
    # the tightest upper fit of exact data is the data, lifted by the stated margin only
    assert memory.envelope == pytest.approx(1.0, abs=1e-6)
    assert all(r == pytest.approx(MEMORY_UNMETERED_MARGIN, abs=1e-4) for r in memory.residuals)
    # several medium sequences are not charged as if each were the longest
    many = [256] * 4
    assert memory.bytes(many) == pytest.approx(
        (2e6 + 1e5 * 1024 + 50.0 * 256**2) * (1 + MEMORY_UNMETERED_MARGIN), rel=1e-3
    )
    usable = 5e6 + 300e6
    cost, scheme_fit = fit_scheme(samples, usable_bytes=usable)
    assert (
        cost.activation_bytes_per_longest_sq == pytest.approx(m3)
        and scheme_fit.activation_bytes_per_longest_sq == cost.activation_bytes_per_longest_sq
    )
    per_square = cost.activation_bytes_per_token_sq + cost.activation_bytes_per_longest_sq
    in_flight = 2  # stage 0 of a two-stage 1F1B pipeline
    worst = lambda t: cost.static_bytes + in_flight * (cost.activation_bytes_per_token * t + per_square * t * t)  # noqa: E731
    assert worst(cost.capacity_tokens) <= usable < worst(cost.capacity_tokens + 1)


@pytest.mark.parametrize(
    ("without", "with_term", "estimated", "measured_bound"),
    [
        (entry(0.0), entry(200.0), 200.0 * 1000**2, 200.0 * (1000**2 + 200**2)),
        (entry(200.0), entry(200.0, 3.0), 3.0 * 1000**2.5, 3.0 * (1000**2 + 200**2) ** 1.25),
    ],
    ids=["longest square", "longest power"],
)
def test_the_peak_estimates_of_plans_and_sessions_count_the_term(without, with_term, estimated, measured_bound) -> None:
    from types import SimpleNamespace

    from hydraplan.api.service.planning import _peak_memory_bytes
    from hydraplan.cost_models.online_fit import MeasuredMicroBatch, predicted_peak_bytes

    batches = [
        SimpleNamespace(lengths=[1000, 200], num_tokens=1200),
        SimpleNamespace(lengths=[300] * 3, num_tokens=900),
    ]
    # the estimate's peak: the largest micro-batch with its longest sequence's term charged
    assert _peak_memory_bytes(with_term, batches) - _peak_memory_bytes(without, batches) == pytest.approx(estimated)
    # a session's measured micro-batch has no lengths: the root of its sum of squares bounds its longest
    measured = [MeasuredMicroBatch(sum_sq_tokens=1000**2 + 200**2, num_tokens=1200, time_s=1.0)]
    extra = predicted_peak_bytes(with_term, measured) - predicted_peak_bytes(without, measured)
    assert extra == pytest.approx(measured_bound)


# ---------------------------------------------------------------------------------------------
# m4 * max(l)^2.5: one long sequence's peak growing faster than its square (CPU, set 8)
# ---------------------------------------------------------------------------------------------


def test_the_capacity_keeps_the_power_term_in_the_planner_and_the_checker() -> None:
    plain, powered = profile(200.0), profile(200.0, 3.0)
    capacity = derive_capacity_tokens(powered, powered.schemes[0])
    assert capacity == reference.capacity_tokens(powered, powered.schemes[0])
    assert capacity == ProfileCostModel(powered).capacity_tokens(ParallelScheme(1, 1, 1))
    assert capacity < derive_capacity_tokens(plain, plain.schemes[0])
    # the bound: one sequence of `capacity` tokens fits, one more token does not
    free = 300 * MIB

    def peak(t: int) -> float:
        return 0.1 * MIB * t + 200.0 * t**2 + 3.0 * t**2.5

    assert peak(capacity) <= free < peak(capacity + 1)
    # planned with the term, no micro-batch passes it, and the checker (its own capacity) agrees
    lengths = [capacity + 300, 400, 300, 200]
    split = SolverOptions(time_limit_s=5, solver="greedy", strategy_pool=["1x<1,1,1>"], oversize="split")
    planned = solve(PlanRequest(lengths=lengths, num_gpus=1, options=split), powered)
    assert check_plan(planned, powered) == []
    assert max(b.num_tokens for p in planned.pipelines for b in p.micro_batches) <= capacity
    # a plan made without the term is refused by the checker with it
    unaware = solve(PlanRequest(lengths=[derive_capacity_tokens(plain, plain.schemes[0])], num_gpus=1), plain)
    assert any("exceed capacity" in violation for violation in check_plan(unaware, powered))


@pytest.mark.parametrize("per_token", [0.0, 1e3, 1e5])
@pytest.mark.parametrize("per_square", [0.0, 7.0, 300.0])
@pytest.mark.parametrize("per_power", [0.0, 0.5, 40.0])
def test_most_tokens_is_the_largest_fitting_count(per_token: float, per_square: float, per_power: float) -> None:
    free = 5e8
    if per_token == per_square == per_power == 0:
        assert most_tokens(free, per_token, per_square, per_power) == 2**62
        return
    tokens = most_tokens(free, per_token, per_square, per_power)

    def used(t: int) -> float:
        return per_token * t + per_square * t * t + per_power * t**2.5

    assert used(tokens) <= free < used(tokens + 1)
    assert most_tokens(0.0, per_token, per_square, per_power) == 0


def samples_with_power_term() -> list[StageSample]:
    """Real peaks `2e6 + 1e5 T + 20 max(l)^2 + 0.8 max(l)^2.5` bytes on the profiler's mixes."""
    shapes = []
    for tokens in (128, 256, 512, 768):
        shapes += [[tokens], [32] * (tokens // 32), [tokens // 2, *([32] * (tokens // 64))], [tokens // 2] * 2]
    shapes.append([1536])
    return real_peak_samples(
        shapes, lambda lengths: 2e6 + 1e5 * sum(lengths) + 20.0 * max(lengths) ** 2 + 0.8 * max(lengths) ** 2.5
    )


def test_the_fit_finds_the_power_term_and_predicts_beyond_the_grid() -> None:
    samples = samples_with_power_term()
    memory = fit_memory(samples)
    m0, m1, m2, m3, m4 = memory.coefficients
    assert m4 == pytest.approx(0.8 * (1 + MEMORY_UNMETERED_MARGIN), rel=1e-3)
    assert all(r == pytest.approx(MEMORY_UNMETERED_MARGIN, abs=1e-4) for r in memory.residuals)
    # twice the longest measured sequence: the quadratic form alone would under-predict it
    truth = 2e6 + 1e5 * 3072 + 20.0 * 3072**2 + 0.8 * 3072**2.5
    assert memory.bytes([3072]) == pytest.approx(truth * (1 + MEMORY_UNMETERED_MARGIN), rel=1e-3)
    # the quadratic terms alone, fitted above the same peaks, under-predict it
    features = np.array([memory_features(s.lengths)[:4] for s in samples])
    quadratic = np.array(upper_fit(features, np.array([s.peak_bytes for s in samples])))
    assert float(np.dot(quadratic, memory_features([3072])[:4])) < truth
    cost, scheme_fit = fit_scheme(samples, usable_bytes=5e6 + 2e9)
    assert cost.activation_bytes_per_longest_pow == pytest.approx(m4) == scheme_fit.activation_bytes_per_longest_pow

    def worst(t: int) -> float:
        return (
            cost.static_bytes
            + cost.activation_bytes_per_token * t
            + (cost.activation_bytes_per_token_sq + cost.activation_bytes_per_longest_sq) * t**2
            + cost.activation_bytes_per_longest_pow * t**2.5
        )

    assert worst(cost.capacity_tokens) <= 5e6 + 2e9 < worst(cost.capacity_tokens + 1)


def test_a_profile_without_the_power_term_is_written_as_before() -> None:
    assert "activation_bytes_per_longest_pow" not in json.loads(profile(5.0).model_dump_json())["schemes"][0]
    assert json.loads(profile(5.0, 0.5).model_dump_json())["schemes"][0]["activation_bytes_per_longest_pow"] == 0.5
