"""The planner's input bounds (planner/limits.py): each hostile or careless input of issue 10 is
refused at the boundary types, naming the field, before any work."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import load_gpus, load_models
from hydraplan.planner import limits
from hydraplan.planner.cache import WeightedLru
from hydraplan.planner.schemas import CostProfile, GpuSpec, Plan, PlanRequest, SolverOptions
from hydraplan.planner.simulate import _ORDERS, dependency_order, simulate_1f1b
from hydraplan.planner.solve import solve
from hydraplan.planner.strategies import check_strategy_fits, parse_strategy


def error_of(model: type, data: dict[str, Any]) -> tuple[tuple, str]:
    """(location, message) of the first validation error of `data`; fails if `data` is valid."""
    started = time.perf_counter()
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    assert time.perf_counter() - started < 1.0, "a refusal must be quick"
    first = info.value.errors()[0]
    return first["loc"], first["msg"]


REQUEST = {"lengths": [100, 200], "num_gpus": 8, "gpus_per_node": 8}


@pytest.mark.parametrize(
    ("update", "loc", "message"),
    [
        ({"previous_strategy": "10000000x<1,1,1>"}, ("previous_strategy",), "limit of 65536 GPUs"),
        ({"previous_strategy": "1000x<1,1,1>"}, ("previous_strategy",), "uses 1000 GPUs, the cluster has 8"),
        ({"previous_strategy": "1x<16,1,1>", "num_gpus": 16}, ("previous_strategy",), "tp 16 > 8 GPUs per node"),
        ({"previous_strategy": " + ".join(["1x<1,1,1>"] * 65)}, ("previous_strategy",), "65 terms"),
        ({"previous_strategy": "x" * 5000}, ("previous_strategy",), "at most"),
        ({"gpus_per_node": 1_000_000_000}, ("gpus_per_node",), "less than or equal to 72"),
        ({"num_gpus": 10**9, "gpus_per_node": 8}, ("num_gpus",), "less than or equal to 65536"),
        ({"lengths": [True]}, ("lengths", 0), "valid integer"),
        ({"lengths": ["5"]}, ("lengths", 0), "valid integer"),
        ({"lengths": [5.0]}, ("lengths", 0), "valid integer"),
        ({"lengths": [10**12]}, ("lengths",), "lengths[0] = 1000000000000: longer than the limit"),
        ({"lengths": [2**31 - 1] * 3}, ("lengths",), "more than the limit of 4294967296"),
        ({"options": {"time_limit_s": float("inf")}}, ("options", "time_limit_s"), "finite"),
        ({"options": {"seed": 2**40}}, ("options", "seed"), "less than or equal to 2147483647"),
        ({"options": {"strategy_pool": ["8x<1,1,1>"] * 300}}, ("options", "strategy_pool"), "at most 256"),
    ],
)
def test_plan_request_bounds(update: dict, loc: tuple, message: str) -> None:
    got_loc, got_message = error_of(PlanRequest, {**REQUEST, **update})
    assert got_loc == loc
    assert message in got_message


def test_a_fitting_previous_strategy_is_accepted() -> None:
    request = PlanRequest.model_validate({**REQUEST, "num_gpus": 16, "previous_strategy": "1x<8,1,1> + 2x<2,2,1>"})
    assert request.previous_strategy == "1x<8,1,1> + 2x<2,2,1>"
    # a cluster smaller than a node: TP up to the cluster
    assert PlanRequest.model_validate({**REQUEST, "num_gpus": 4, "previous_strategy": "1x<4,1,1>"})


def test_strategy_parsing_is_linear_in_the_text() -> None:
    with pytest.raises(ValueError, match="not of the form"):
        parse_strategy("9" * 50 + "x<1,1,1>")
    strategy = check_strategy_fits("2x<4,1,1>", 8, 8, "field")
    assert strategy.num_pipelines == 2
    with pytest.raises(ValueError, match="^field 2x<4,1,1> uses 8 GPUs, the cluster has 16$"):
        check_strategy_fits("2x<4,1,1>", 16, 8, "field")


def profile_data(**scheme_update: Any) -> dict[str, Any]:
    scheme = {"tp": 1, "pp": 1, "a": 1e-9, "b": 1e-4, "c": 1e-3, "capacity_tokens": 8192, **scheme_update}
    return {"num_layers": 4, "schemes": [scheme]}


@pytest.mark.parametrize(
    ("data", "loc", "message"),
    [
        (profile_data(a=1e308), ("schemes", 0, "a"), "less than or equal to 0.001"),
        (profile_data(b=float("inf")), ("schemes", 0, "b"), "finite"),
        (profile_data(c=float("nan")), ("schemes", 0, "c"), "finite"),
        (
            {
                **profile_data(capacity_tokens=None, static_bytes=1e9, activation_bytes_per_token=1e5),
                "gpu_memory_bytes": float("inf"),
            },
            ("gpu_memory_bytes",),
            "finite",
        ),
        ({**profile_data(), "grad_sync_s": 1e300}, ("grad_sync_s",), "less than or equal to"),
        (profile_data(static_bytes=1e300), ("schemes", 0, "static_bytes"), "less than or equal to"),
        (profile_data(pp=8), (), "pp 8 exceeds num_layers 4"),
        ({**profile_data(), "num_layers": 10**9}, ("num_layers",), "less than or equal to 4096"),
    ],
)
def test_profile_bounds(data: dict, loc: tuple, message: str) -> None:
    got_loc, got_message = error_of(CostProfile, data)
    assert got_loc == loc
    assert message in got_message


def test_infinite_gpu_numbers_are_refused() -> None:
    gpu = load_gpus()["h100-sxm-80gb"].model_dump()
    for field in ("memory_bytes", "peak_bf16_flops", "inter_node_bandwidth_bytes_per_s"):
        loc, message = error_of(GpuSpec, {**gpu, field: float("inf")})
        assert loc == (field,) and "finite" in message
    loc, _ = error_of(GpuSpec, {**gpu, "memory_bytes": 1e300})
    assert loc == ("memory_bytes",)


def test_largest_coefficients_keep_every_plan_finite() -> None:
    """At the bounds the planner's arithmetic stays finite: the plan checks and serialises."""
    data = profile_data(a=limits.MAX_COST_A, b=limits.MAX_COST_B, c=limits.MAX_COST_C, capacity_tokens=2**31 - 1)
    profile = CostProfile.model_validate({**data, "grad_sync_s": limits.MAX_TIME_S})
    request = PlanRequest(lengths=[2**31 - 1, 2**30], num_gpus=1, options=SolverOptions(time_limit_s=0.3))
    plan = solve(request, profile)
    assert plan.step_time_s > 1e15
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_plans_to_check_have_a_bounded_schedule() -> None:
    """A plan's 1F1B operations are counted as it is parsed: pp=20000 x 200 micro-batches is
    refused in milliseconds instead of simulating for minutes."""
    model, gpu = load_models()["tiny"], load_gpus()["h100-sxm-80gb"]
    profile = build_profile(model, gpu, 8, 8)
    plan = solve(PlanRequest(lengths=[100] * 16, num_gpus=8, options=SolverOptions(time_limit_s=0.2)), profile)
    data = json.loads(plan.model_dump_json())
    pipeline = data["pipelines"][0]
    pipeline["scheme"]["pp"] = 4000
    pipeline["micro_batches"] = pipeline["micro_batches"][:1] * 200
    loc, message = error_of(Plan, data)
    assert loc == () and "more than the limit of 1000000" in message
    pipeline["scheme"]["pp"] = 20000
    loc, _ = error_of(Plan, data)
    assert loc == ("pipelines", 0, "scheme", "pp")


def test_weighted_cache_is_bounded_by_weight() -> None:
    cache: WeightedLru[int, str] = WeightedLru(10, len)
    for key in range(5):
        assert cache.get_or_make(key, lambda key=key: "abcd") == "abcd"
    assert cache.weight <= 10 and len(cache) == 2  # the two most recent of weight 4
    assert cache.get_or_make(99, lambda: "x" * 11) == "x" * 11  # heavier than the budget: not kept
    assert len(cache) == 2 and 99 not in cache._entries
    cache.get_or_make(3, lambda: "never built")  # a hit
    assert cache.hits == 1


def test_the_schedule_cache_holds_bounded_bytes() -> None:
    _ORDERS.clear()
    for micro_batches in range(200, 2000, 100):
        simulate_1f1b([1.0] * micro_batches, 64, 1 / 3)  # 64 stages: ~25K-250K operations each
    assert _ORDERS.weight <= _ORDERS.max_weight
    assert 0 < len(_ORDERS) < 18
    assert np.array_equal(dependency_order(2, 3), dependency_order(2, 3))


def test_splitting_is_bounded_before_any_chunk_is_made() -> None:
    """A 2^31-token sequence against a 100-token capacity would be 21M chunks (GBs of arrays)."""
    profile = CostProfile.model_validate(profile_data(capacity_tokens=100))
    request = PlanRequest(lengths=[2**31 - 1], num_gpus=1, options=SolverOptions(time_limit_s=0.2, oversize="split"))
    started = time.perf_counter()
    with pytest.raises(ValueError, match="makes 21474837 chunks, more than the limit of 4000000"):
        solve(request, profile)
    assert time.perf_counter() - started < 1.0


def test_analytic_profiles_refuse_absurd_clusters_at_once() -> None:
    model, gpu = load_models()["tiny"], load_gpus()["h100-sxm-80gb"]
    started = time.perf_counter()
    with pytest.raises(ValueError, match="gpus_per_node 1000000000 is more than the limit of 72"):
        build_profile(model, gpu, 8, 10**9)
    with pytest.raises(ValueError, match="num_gpus 131072 is more than the limit of 65536"):
        build_profile(model, gpu, 2**17, 8)
    assert time.perf_counter() - started < 0.5
