"""The training recipe of the analytic model (issue 13): sharded memory, dtypes, recompute's
forward share, exposed communication, the data-parallel bus bandwidth, and how the planner's
gradient-sync term takes them."""

from __future__ import annotations

import pytest

from hydraplan.cost_models.analytic import AnalyticOptions, build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.cost_models.efficiency import gpu_efficiency
from hydraplan.cost_models.recipe import dp_bus_bandwidth, sharded_static_bytes
from hydraplan.planner import reference
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.scheme import ParallelScheme

MODEL, GPU = get_model("llama3-8b"), get_gpu("h100-sxm-80gb")


def entries(options: AnalyticOptions, num_gpus: int = 8, gpus_per_node: int = 8) -> dict:
    return {entry.key: entry for entry in build_profile(MODEL, GPU, num_gpus, gpus_per_node, options).schemes}


def test_zero_memory_follows_rajbhandari() -> None:
    psi, shard, gpus = MODEL.num_params, MODEL.num_params, 8
    zero1 = sharded_static_bytes(MODEL, shard, 1, gpus, "zero1", "fp32", "fp32")
    zero2 = sharded_static_bytes(MODEL, shard, 1, gpus, "zero2", "fp32", "fp32")
    zero3 = sharded_static_bytes(MODEL, shard, 1, gpus, "zero3", "fp32", "fp32")
    assert zero1 == pytest.approx(psi * (2 + 4) + psi * 12 / gpus)
    assert zero2 == pytest.approx(psi * 2 + psi * (4 + 12) / gpus)
    working = max(MODEL.params_per_layer, MODEL.embedding_params) * (2 * 2 + 4)
    assert zero3 == pytest.approx(psi * (2 + 4 + 12) / gpus + working)
    bf16 = sharded_static_bytes(MODEL, shard, 1, gpus, "zero1", "bf16", "bf16")
    assert zero1 - bf16 == pytest.approx(psi * 2 + psi * 4 / gpus)


def test_the_default_recipe_keeps_the_old_static_memory() -> None:
    default = entries(AnalyticOptions())[(1, 1, 2)]
    psi = MODEL.num_params
    assert default.static_bytes == pytest.approx(psi * 6 + psi * 12 / 8)


def test_bf16_gradients_and_fsdp_fit_the_8k_recipe_the_default_does_not() -> None:
    # issue 13: Llama 3 8B on 8 H100, <1,1,2> at 8K runs; ZeRO-1 with fp32 gradients held 5,382
    ran = 8192
    assert entries(AnalyticOptions())[(1, 1, 2)].capacity_tokens < ran
    assert entries(AnalyticOptions(grad_dtype="bf16"))[(1, 1, 2)].capacity_tokens > ran
    assert entries(AnalyticOptions(sharding="fsdp"))[(1, 1, 2)].capacity_tokens > ran


def test_fsdp_is_zero3_and_bad_names_are_refused() -> None:
    assert AnalyticOptions(sharding="fsdp").sharding == "zero3"
    with pytest.raises(ValueError, match="sharding"):
        AnalyticOptions(sharding="zero4")
    with pytest.raises(ValueError, match="grad_dtype"):
        AnalyticOptions(grad_dtype="fp16")
    with pytest.raises(ValueError, match="tp_comm_exposed"):
        AnalyticOptions(tp_comm_exposed=1.5)


def test_full_recompute_forward_share_is_a_quarter() -> None:
    assert entries(AnalyticOptions(recompute="full"))[(1, 1, 1)].fwd_fraction == pytest.approx(1 / 4)
    assert entries(AnalyticOptions())[(1, 1, 1)].fwd_fraction == pytest.approx(1 / 3)
    assert entries(AnalyticOptions(recompute="selective-op"))[(1, 1, 1)].fwd_fraction == pytest.approx(1 / 3.5)


def test_exposed_tp_communication_scales_only_the_tp_term() -> None:
    # the default (catalog) efficiency runs NVLink collectives at the H100 entry's bus share (80%)
    h, layers = MODEL.hidden_size, MODEL.num_layers
    intra = GPU.intra_node_bandwidth_bytes_per_s * gpu_efficiency(GPU.name).nvlink_bus_efficiency
    assert intra == pytest.approx(360e9)
    tp_comm_s = layers * 4 * (2 * 7 / 8) * 2 * h / intra
    full = entries(AnalyticOptions())[(8, 1, 1)].b
    hidden = entries(AnalyticOptions(tp_comm_exposed=0.0))[(8, 1, 1)].b
    quarter = entries(AnalyticOptions(tp_comm_exposed=0.25))[(8, 1, 1)].b
    assert full - hidden == pytest.approx(tp_comm_s)
    assert quarter - hidden == pytest.approx(tp_comm_s / 4)


def test_dp_bus_bandwidth_uses_every_nic_of_a_node() -> None:
    intra, inter = 360e9, 40e9
    assert dp_bus_bandwidth(ParallelScheme(1, 1, 1), 16, 8, intra, inter) == pytest.approx(8 * inter)
    assert dp_bus_bandwidth(ParallelScheme(8, 1, 1), 16, 8, intra, inter) == pytest.approx(inter)
    assert dp_bus_bandwidth(ParallelScheme(2, 1, 2), 16, 8, intra, inter) == pytest.approx(4 * inter)
    assert dp_bus_bandwidth(ParallelScheme(1, 1, 1), 16, 8, 300e9, inter) == pytest.approx(300e9)
    assert dp_bus_bandwidth(ParallelScheme(8, 1, 1), 8, 8, intra, inter) == pytest.approx(intra)


def test_grad_sync_takes_scheme_bandwidth_bytes_and_exposure() -> None:
    options = AnalyticOptions(efficiency="catalog", sharding="zero3", dp_sync_exposed=0.5)
    profile = build_profile(MODEL, GPU, 16, 8, options)
    cost, scheme = ProfileCostModel(profile), ParallelScheme(1, 1, 1)
    entry = next(entry for entry in profile.schemes if entry.key == (1, 1, 1))
    assert entry.grad_sync_bytes_per_gpu == pytest.approx(entry.grad_bytes_per_gpu / 2)
    expected = 2 * 15 / 16 * entry.grad_sync_bytes_per_gpu / entry.grad_sync_bandwidth_bytes_per_s * 0.5
    assert cost.grad_sync_s([scheme] * 16) == pytest.approx(expected)
    assert reference.grad_sync_s(profile, [(1, 1, 1)] * 16) == pytest.approx(expected)


def test_a_profile_without_the_new_fields_syncs_as_before() -> None:
    # the flat model (before issue 13) writes no per-scheme sync fields
    profile = build_profile(MODEL, GPU, 16, 8, AnalyticOptions(efficiency="flat"))
    entry = next(entry for entry in profile.schemes if entry.key == (1, 1, 1))
    assert entry.grad_sync_bandwidth_bytes_per_s is None and entry.grad_sync_bytes_per_gpu is None
    expected = 2 * 15 / 16 * entry.grad_bytes_per_gpu / profile.grad_sync_bandwidth_bytes_per_s
    assert ProfileCostModel(profile).grad_sync_s([ParallelScheme(1, 1, 1)] * 16) == pytest.approx(expected)


def test_zero3_gathers_land_in_the_per_micro_batch_term() -> None:
    zero1 = entries(AnalyticOptions(), 16)[(1, 1, 1)]
    zero3 = entries(AnalyticOptions(sharding="zero3"), 16)[(1, 1, 1)]
    hidden = entries(AnalyticOptions(sharding="zero3", dp_sync_exposed=0.0), 16)[(1, 1, 1)]
    assert zero3.c > zero1.c
    assert hidden.c == pytest.approx(zero1.c)


def test_the_default_recipe_is_the_validated_catalog_model() -> None:
    assert AnalyticOptions().efficiency == "catalog"
    assert build_profile(MODEL, GPU, 16, 8).recipe.efficiency == "catalog"
    flat = entries(AnalyticOptions(efficiency="flat"))
    assert entries(AnalyticOptions())[(8, 1, 1)].b != flat[(8, 1, 1)].b


def test_catalog_efficiency_is_slower_on_narrow_shards() -> None:
    flat = entries(AnalyticOptions(efficiency="flat"))
    catalog = entries(AnalyticOptions(efficiency="catalog"))
    # the narrow TP-8 GEMMs lose more than the TP-1 ones against the flat model
    assert catalog[(8, 1, 1)].b / flat[(8, 1, 1)].b > catalog[(1, 1, 1)].b / flat[(1, 1, 1)].b


def test_every_catalog_gpu_has_sourced_efficiency_figures() -> None:
    from hydraplan.cost_models.catalog import load_gpus
    from hydraplan.cost_models.efficiency import gpu_efficiency

    for name in load_gpus():
        figures = gpu_efficiency(name)
        assert figures is not None, name
        assert "nccl-tests" in figures.source and "FlashAttention" in figures.source
    assert gpu_efficiency("a-user-gpu") is None
    # a GPU without figures keeps the flat model even in catalog mode
    user_gpu = GPU.model_copy(update={"name": "a-user-gpu"})
    flat = build_profile(MODEL, user_gpu, 8, 8, AnalyticOptions(efficiency="flat"))
    catalog = build_profile(MODEL, user_gpu, 8, 8, AnalyticOptions(efficiency="catalog"))
    assert [entry.b for entry in flat.schemes] == [entry.b for entry in catalog.schemes]


def test_a_plan_on_a_recipe_profile_passes_the_independent_checker() -> None:
    from hydraplan.planner.check import check_plan
    from hydraplan.planner.schemas import PlanRequest, SolverOptions
    from hydraplan.planner.solve import solve

    options = AnalyticOptions(efficiency="catalog", sharding="zero3", grad_dtype="bf16", dp_sync_exposed=0.5)
    profile = build_profile(get_model("tiny"), GPU, 16, 8, options)
    lengths = [64 + (index * 7919) % 6000 for index in range(80)]
    request = PlanRequest(
        lengths=lengths, num_gpus=16, gpus_per_node=8, options=SolverOptions(time_limit_s=0.3, solver="greedy")
    )
    plan = solve(request, profile)
    assert check_plan(plan) == []
    assert plan.grad_sync_s == pytest.approx(
        reference.grad_sync_s(profile, [(p.scheme.tp, p.scheme.pp, p.scheme.cp) for p in plan.pipelines])
    )
