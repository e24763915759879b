"""Differential tests: the checker's reference costs (planner/reference.py) and the solver's own
code (simulator, cost model, strategies, switching) agree on random inputs; each is the other's
oracle, written apart."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hydraplan.planner import reference
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import CostProfile, SchemeCost, derive_capacity_tokens
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.simulate import simulate_1f1b
from hydraplan.planner.strategies import Strategy, parse_strategy
from hydraplan.planner.switching import pipeline_blocks, switch_cost_s

SCHEMES = [(tp, pp, cp) for tp in (1, 2, 4) for pp in (1, 2, 3, 4) for cp in (1, 2)]


@settings(max_examples=300)
@given(
    times=st.lists(st.floats(min_value=1e-3, max_value=10.0), max_size=14),
    num_stages=st.integers(min_value=1, max_value=7),
    fwd_fraction=st.floats(min_value=0.05, max_value=0.95),
)
def test_the_two_1f1b_simulations_agree(times: list[float], num_stages: int, fwd_fraction: float) -> None:
    solver = simulate_1f1b(times, num_stages, fwd_fraction)
    checker = reference.pipeline_time_s(times, num_stages, fwd_fraction)
    assert math.isclose(solver, checker, rel_tol=1e-12, abs_tol=1e-12)


def test_the_reference_simulation_by_hand() -> None:
    """Two stages, two micro-batches of 3 s (1 s forward, 2 s backward): F0 F1 on stage 0 at
    0-1, 1-2; stage 1 runs F0 1-2, B0 2-4, F1 4-5, B1 5-7; stage 0 runs B0 4-6, B1 7-9."""
    assert reference.pipeline_time_s([3.0, 3.0], 2, 1 / 3) == 9.0
    assert reference.pipeline_time_s([2.0, 5.0], 1, 0.5) == 7.0
    assert reference.pipeline_time_s([], 4, 0.5) == 0.0


scheme_costs = st.builds(
    lambda scheme, a, b, c, grad, memory: SchemeCost(
        tp=scheme[0], pp=scheme[1], cp=scheme[2], a=a, b=b, c=c, grad_bytes_per_gpu=grad, **memory
    ),
    st.sampled_from(SCHEMES),
    st.floats(min_value=0, max_value=1e-6),
    st.floats(min_value=0, max_value=1e-3),
    st.floats(min_value=0, max_value=1e-2),
    st.floats(min_value=1e6, max_value=1e10),
    st.one_of(
        st.builds(lambda capacity: {"capacity_tokens": capacity}, st.integers(min_value=1, max_value=10**6)),
        st.builds(
            lambda static, m1, m2, m3, flight: {
                "static_bytes": static,
                "activation_bytes_per_token": m1,
                "activation_bytes_per_token_sq": m2,
                "activation_bytes_per_longest_sq": m3,
                "in_flight_micro_batches": flight,
            },
            st.floats(min_value=0, max_value=4e10),
            st.floats(min_value=1.0, max_value=1e6),
            st.floats(min_value=0, max_value=10.0),
            st.sampled_from([0.0, 0.5, 20.0]),
            st.one_of(st.none(), st.integers(min_value=1, max_value=8)),
        ),
    ),
)


@st.composite
def profiles(draw) -> CostProfile:
    entries = draw(st.lists(scheme_costs, min_size=1, max_size=6, unique_by=lambda entry: entry.key))
    data = {
        "num_layers": 8,
        "time_unit": draw(st.sampled_from(["s", "ms"])),
        "gpu_memory_bytes": 8e10,
        "memory_reserve_bytes": draw(st.floats(min_value=0, max_value=1e9)),
        "grad_sync_s": draw(st.one_of(st.none(), st.floats(min_value=0, max_value=5))),
        "grad_sync_bandwidth_bytes_per_s": draw(st.one_of(st.none(), st.floats(min_value=1e9, max_value=1e12))),
        "switch_bytes_per_weight_byte": draw(st.sampled_from([1.0, 3.0, 1.5])),
        "schemes": [entry.model_dump() for entry in entries],
    }
    try:
        return CostProfile.model_validate(data)
    except ValueError:  # static memory leaves no room for activations
        assume(False)
        raise


@settings(max_examples=150)
@given(profile=profiles(), lengths=st.lists(st.integers(min_value=1, max_value=40_000), min_size=1, max_size=8))
def test_costs_capacities_and_sync_agree(profile: CostProfile, lengths: list[int]) -> None:
    cost = ProfileCostModel(profile)
    schemes = [entry.key for entry in profile.schemes]
    for entry in profile.schemes:
        scheme = ParallelScheme(*entry.key)
        assert reference.capacity_tokens(profile, entry) == derive_capacity_tokens(profile, entry)
        assert reference.capacity_tokens(profile, entry) == cost.capacity_tokens(scheme)
        assert math.isclose(reference.stage_time_s(profile, entry, lengths), cost.stage_time_s(scheme, lengths))
    solver_sync = cost.grad_sync_s([ParallelScheme(*key) for key in schemes])
    assert math.isclose(reference.grad_sync_s(profile, schemes), solver_sync, rel_tol=1e-12, abs_tol=1e-15)


strategy_terms = st.lists(
    st.tuples(st.sampled_from(SCHEMES), st.integers(min_value=1, max_value=3)), min_size=1, max_size=4
)


@settings(max_examples=150)
@given(previous_terms=strategy_terms, current_terms=strategy_terms, profile=profiles())
def test_strategy_text_placement_and_switch_cost_agree(previous_terms, current_terms, profile: CostProfile) -> None:
    previous = Strategy.of([(ParallelScheme(*scheme), count) for scheme, count in previous_terms])
    current = Strategy.of([(ParallelScheme(*scheme), count) for scheme, count in current_terms])
    text = " + ".join(f"{count}x<{s[0]},{s[1]},{s[2]}>" for s, count in current_terms)
    assert reference.canonical_strategy([(s.tp, s.pp, s.cp) for s in current.pipeline_schemes()]) == str(current)
    assert str(parse_strategy(text)) == str(current)
    blocks = {((s.tp, s.pp, s.cp), ranks) for s, ranks in pipeline_blocks(current)}
    assert reference.placed_blocks(text) == blocks
    # the switch cost, over a profile that holds every scheme either strategy uses
    used = {key for key, _ in previous_terms + current_terms}
    entry = profile.schemes[0]
    full = profile.model_copy(
        update={"schemes": [entry.model_copy(update={"tp": tp, "pp": pp, "cp": cp}) for tp, pp, cp in sorted(used)]}
    )
    pipelines = [(scheme, ranks) for scheme, ranks in pipeline_blocks(current)]
    keyed = [((s.tp, s.pp, s.cp), ranks) for s, ranks in pipelines]
    if full.grad_sync_bandwidth_bytes_per_s is None:  # neither prices a switch it cannot price
        with pytest.raises(PlanningError, match="grad_sync_bandwidth_bytes_per_s"):
            switch_cost_s(previous, pipelines, ProfileCostModel(full))
        with pytest.raises(ValueError, match="grad_sync_bandwidth_bytes_per_s"):
            reference.switch_cost_s(full, str(previous), keyed)
        return
    solver = switch_cost_s(previous, pipelines, ProfileCostModel(full))
    checker = reference.switch_cost_s(full, str(previous), keyed)
    assert math.isclose(solver, checker, rel_tol=1e-12, abs_tol=1e-15)
