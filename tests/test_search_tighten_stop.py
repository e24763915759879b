"""The bound tightening after the search stops once a bound it cannot raise holds the global one
(`search._held_beyond_reach`): the steps left would raise only bounds above it."""

from __future__ import annotations

import types

import pytest

import hydraplan.planner.solve as solve_module
from hydraplan.api.datasets import sample_batch
from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner import search
from hydraplan.planner.schemas import PlanRequest, SolverOptions


def _entry(bound_s: float, name: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(bound_s=bound_s, strategy=name)


def held(frontier, refined: set, least_set_s: float, incumbent_s: float = 10.0) -> bool:
    waiting, held_s = search._waiting_and_held(frontier, refined, incumbent_s)
    return search._held_beyond_reach(held_s, least_set_s, waiting)


def test_waiting_and_held_split_the_strategies_in_one_pass():
    frontier = types.SimpleNamespace(floor_s=9.0, strategies=[_entry(4.0, "a"), _entry(5.0, "b"), _entry(12.0, "c")])
    assert search._waiting_and_held(frontier, {"a"}, 10.0) == ([(5.0, 1)], 4.0)  # "c" is above the incumbent
    assert search._waiting_and_held(frontier, set(), 10.0) == ([(4.0, 0), (5.0, 1)], 9.0)  # the floor holds


def test_held_only_when_the_least_bound_is_out_of_the_tightening_s_reach():
    frontier = types.SimpleNamespace(floor_s=9.0, strategies=[_entry(4.0, "a"), _entry(5.0, "b"), _entry(6.0, "c")])
    assert held(frontier, {"a"}, 7.0)  # "a" was raised already and holds 4.0
    assert not held(frontier, {"b"}, 7.0)  # "a" may still rise
    assert not held(frontier, {"a"}, 3.5)  # a set below it may still rise
    assert held(frontier, {"a"}, 4.0)  # ties: raising the set cannot help
    assert not held(frontier, set(), 7.0)  # nothing raised yet
    floor_held = types.SimpleNamespace(floor_s=3.0, strategies=[_entry(4.0, "a")])
    assert held(floor_held, set(), 7.0)  # the huge sets' floor holds it


@pytest.fixture(scope="module")
def sft_mix_request():
    """32B / 64 A100, an SFT mix of ~100 items, a 4 s budget (the deeper tightening)."""
    profile = build_profile(get_model("llama-32b"), get_gpu("a100-80gb"), 64, 8)
    lengths = sample_batch("sft-mix", 100_000, 1, 32 * 1024)
    options = SolverOptions(time_limit_s=4.0, seed=1, oversize="split")
    return profile, PlanRequest(lengths=lengths, num_gpus=64, gpus_per_node=8, options=options)


def test_stopping_when_held_saves_packing_bounds_and_loses_no_bound(monkeypatch, sft_mix_request):
    profile, request = sft_mix_request
    monkeypatch.setattr(solve_module, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))  # work limits only
    batches = []
    real = search._pack_bound_batch

    def spy(frontier, batch, *args, **kwargs):
        batches.append(len(batch))
        return real(frontier, batch, *args, **kwargs)

    monkeypatch.setattr(search, "_pack_bound_batch", spy)
    stopped = solve_module.solve(request, profile)
    stopped_batches = len(batches)
    batches.clear()
    monkeypatch.setattr(search, "_held_beyond_reach", lambda *args: False)
    full = solve_module.solve(request, profile)
    assert stopped_batches < len(batches)  # the full tightening went on raising bounds above the held one
    assert stopped.lower_bound_s == full.lower_bound_s
    assert stopped.objective_s == full.objective_s and stopped.strategy == full.strategy
