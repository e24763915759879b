"""Analytic cost model: golden formulas from the papers, and profile sanity."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydraplan.cost_models.analytic import (
    AnalyticOptions,
    activation_bytes_per_layer,
    build_profile,
    candidate_schemes,
    training_flops_per_token,
)
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile, ModelSpec, SchemeCost
from hydraplan.planner.scheme import ParallelScheme

GPT3_175B = ModelSpec(
    name="gpt3-175b",
    num_layers=96,
    hidden_size=12288,
    ffn_hidden_size=4 * 12288,
    num_heads=96,
    num_kv_heads=96,
    vocab_size=51200,
    gated_mlp=False,
    tied_embeddings=False,
)


def narayanan_flops_per_token(layers: int, hidden: int, vocab: int, seq_len: int) -> float:
    """Narayanan et al. 2021: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)), per token (B*s)."""
    return 96 * layers * hidden**2 * (1 + seq_len / (6 * hidden) + vocab / (16 * layers * hidden))


@pytest.fixture(scope="module")
def llama3_8b_profile() -> CostProfile:
    return build_profile(get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), 64, 8)


# --- golden FLOPs ------------------------------------------------------------------------------


@pytest.mark.parametrize("seq_len", [2048, 8192])
def test_flops_reproduce_narayanan_for_gpt(seq_len: int) -> None:
    expected = narayanan_flops_per_token(96, 12288, 51200, seq_len)
    computed = training_flops_per_token(GPT3_175B, seq_len, recompute="full", causal=False)
    assert computed == pytest.approx(expected, rel=0.01)


def test_flops_of_llama_7b_within_one_percent_of_narayanan() -> None:
    expected = narayanan_flops_per_token(32, 4096, 32000, 4096)
    computed = training_flops_per_token(get_model("llama2-7b"), 4096)
    assert computed == pytest.approx(expected, rel=0.01)
    assert computed != expected  # the gated MLP (3*h*f, f=11008) is not exactly 8h^2


def test_causal_mask_halves_only_the_attention_flops() -> None:
    model, seq_len = get_model("llama3-8b"), 4096
    full = training_flops_per_token(model, seq_len, recompute="full", causal=False)
    causal = training_flops_per_token(model, seq_len, recompute="full", causal=True)
    attention_full = model.num_layers * 4 * seq_len * model.hidden_size * 4  # 4x forward
    assert full - causal == pytest.approx(attention_full / 2)


def test_no_recompute_is_six_flops_per_parameter_for_short_sequences() -> None:
    # The classic 6N rule (Kaplan et al. 2020) for weight matmuls when attention is negligible.
    model = get_model("llama3-8b")
    flops = training_flops_per_token(model, 1, recompute="none")
    norm_params = model.num_layers * 2 * model.hidden_size  # norms have no matmul FLOPs
    weight_params = model.num_params - norm_params - model.embedding_params
    assert flops == pytest.approx(6 * weight_params, rel=1e-3)


# --- golden activation memory (Korthikanti et al. 2022, GPT-3 175B, t=8) ------------------------

S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(tp=1, sequence_parallel=False), SBH * (34 + 5 * A * S / H)),
        (dict(tp=T, sequence_parallel=False), SBH * (10 + 24 / T + 5 * A * S / (H * T))),
        (dict(tp=T, sequence_parallel=True), SBH * (34 / T + 5 * A * S / (H * T))),
        (dict(tp=T, sequence_parallel=False, recompute="selective"), SBH * (10 + 24 / T)),
        (dict(tp=T, sequence_parallel=True, recompute="selective"), SBH * 34 / T),
        (dict(tp=T, sequence_parallel=True, flash_attention=True), SBH * 34 / T),
        (dict(tp=T, sequence_parallel=False, recompute="full"), 2 * SBH),
        (dict(tp=T, sequence_parallel=True, recompute="full"), 2 * SBH / T),
    ],
)
def test_activation_memory_reproduces_korthikanti(kwargs: dict, expected: float) -> None:
    computed = activation_bytes_per_layer(GPT3_175B, S, B, **kwargs)
    assert computed == pytest.approx(expected, rel=1e-12)


def test_activation_memory_scales_with_micro_batch_and_drops_dropout_masks() -> None:
    one = activation_bytes_per_layer(GPT3_175B, S, 1, 1)
    assert activation_bytes_per_layer(GPT3_175B, S, 4, 1) == pytest.approx(4 * one)
    no_dropout = activation_bytes_per_layer(GPT3_175B, S, 1, 1, dropout=False)
    # Without dropout: two 1-byte masks per token go, and the score matrix keeps 2 of 5 bytes.
    assert one - no_dropout == pytest.approx(S * 2 * H + 3 * A * S * S)


def test_gqa_and_gated_mlp_change_the_per_token_bytes() -> None:
    mha = get_model("llama2-7b")
    gqa = mha.model_copy(update={"num_kv_heads": 8})
    saved = activation_bytes_per_layer(mha, S, 1, 1, recompute="selective", dropout=False)
    saved -= activation_bytes_per_layer(gqa, S, 1, 1, recompute="selective", dropout=False)
    assert saved == pytest.approx(S * 4 * (mha.kv_dim - gqa.kv_dim))  # K and V, 2 bytes each
    plain = mha.model_copy(update={"gated_mlp": False})
    extra = activation_bytes_per_layer(mha, S, 1, 1, recompute="selective", dropout=False)
    extra -= activation_bytes_per_layer(plain, S, 1, 1, recompute="selective", dropout=False)
    assert extra == pytest.approx(S * 2 * mha.ffn_hidden_size)


# --- the analytic profile -------------------------------------------------------------------------


def test_every_scheme_is_valid(llama3_8b_profile: CostProfile) -> None:
    model = get_model("llama3-8b")
    assert llama3_8b_profile.source == "analytic"
    assert (llama3_8b_profile.model, llama3_8b_profile.gpu) == ("llama3-8b", "h100-sxm-80gb")
    for scheme in llama3_8b_profile.schemes:
        assert model.num_kv_heads % scheme.tp == 0 and 8 % scheme.tp == 0
        assert model.num_layers % scheme.pp == 0
        assert scheme.cp in (1, 2, 4, 8, 16)
        assert scheme.tp * scheme.pp * scheme.cp <= 64
        assert scheme.capacity_tokens is not None and scheme.capacity_tokens >= 1024
        assert scheme.a > 0 and scheme.b > 0 and scheme.c > 0
    keys = {scheme.key for scheme in llama3_8b_profile.schemes}
    assert {(1, 1, 1), (8, 1, 1), (4, 2, 1), (8, 1, 2), (8, 4, 1)} <= keys
    assert (16, 1, 1) not in keys  # TP may not leave the node


def test_schemes_below_min_capacity_are_dropped() -> None:
    model, gpu = get_model("llama3-8b"), get_gpu("h100-sxm-80gb")
    strict = build_profile(model, gpu, 64, 8, AnalyticOptions(min_capacity_tokens=8192))
    loose = build_profile(model, gpu, 64, 8)
    loose_keys = {scheme.key for scheme in loose.schemes}
    assert (1, 1, 1) in loose_keys  # ~4.8K tokens
    assert {scheme.key for scheme in strict.schemes} < loose_keys
    assert all(scheme.capacity_tokens >= 8192 for scheme in strict.schemes)


def test_attention_time_falls_as_tp_times_cp_grows(llama3_8b_profile: CostProfile) -> None:
    by_pp: dict[int, list[SchemeCost]] = {}
    for scheme in llama3_8b_profile.schemes:
        by_pp.setdefault(scheme.pp, []).append(scheme)
    for schemes in by_pp.values():
        ordered = sorted(schemes, key=lambda scheme: scheme.tp * scheme.cp)
        for smaller, larger in zip(ordered, ordered[1:], strict=False):
            if smaller.tp * smaller.cp < larger.tp * larger.cp:
                assert larger.a < smaller.a
            else:
                assert larger.a == pytest.approx(smaller.a)


def test_capacity_grows_with_cp(llama3_8b_profile: CostProfile) -> None:
    by_key = {scheme.key: scheme for scheme in llama3_8b_profile.schemes}
    compared = 0
    for (tp, pp, cp), scheme in by_key.items():
        doubled = by_key.get((tp, pp, 2 * cp))
        if doubled is not None:
            assert doubled.capacity_tokens > scheme.capacity_tokens
            compared += 1
    assert compared >= 10


def test_capacity_is_the_largest_token_count_that_fits() -> None:
    model, gpu = get_model("llama3-8b"), get_gpu("h100-sxm-80gb")
    profile = build_profile(model, gpu, 64, 8)
    usable = gpu.memory_bytes - profile.memory_reserve_bytes
    logits_per_token = 4 * model.vocab_size
    scheme = next(entry for entry in profile.schemes if entry.key == (1, 1, 1))
    per_token = scheme.activation_bytes_per_token + logits_per_token
    assert scheme.static_bytes + per_token * scheme.capacity_tokens <= usable
    assert scheme.static_bytes + per_token * (scheme.capacity_tokens + 1) > usable
    # pp > 1: stage 0 holds pp micro-batches and binds before the last stage does.
    staged = next(entry for entry in profile.schemes if entry.key == (1, 4, 1))
    assert staged.in_flight_micro_batches == 4
    in_flight = staged.in_flight_micro_batches * staged.activation_bytes_per_token
    assert staged.static_bytes + in_flight * staged.capacity_tokens <= usable
    assert staged.static_bytes + in_flight * (staged.capacity_tokens + 1) > usable
    assert staged.capacity_tokens > scheme.capacity_tokens


def test_grad_sync_bandwidth_is_the_slowest_link() -> None:
    model, gpu = get_model("tiny"), get_gpu("a100-80gb")
    assert build_profile(model, gpu, 16, 8).grad_sync_bandwidth_bytes_per_s == 25e9
    assert build_profile(model, gpu, 8, 8).grad_sync_bandwidth_bytes_per_s == 300e9


def test_communication_terms_of_b() -> None:
    # the flat model: matmuls scale exactly as 1/tp (no GEMM shape or memory-bound terms), links at peak
    model, gpu, flat = get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), AnalyticOptions(efficiency="flat")
    h, kv_dim, layers = model.hidden_size, model.kv_dim, model.num_layers
    intra, inter = gpu.intra_node_bandwidth_bytes_per_s, gpu.inter_node_bandwidth_bytes_per_s
    wide = {entry.key: entry for entry in build_profile(model, gpu, 16, 8, flat).schemes}
    narrow = {entry.key: entry for entry in build_profile(model, gpu, 16, 4, flat).schemes}
    # TP: matmul time scales as 1/tp; the rest is 4 ring all-reduces of 2h bytes per layer.
    tp_comm_s = layers * 4 * (2 * 7 / 8) * 2 * h / intra
    assert wide[(8, 1, 1)].b - wide[(1, 1, 1)].b / 8 == pytest.approx(tp_comm_s)
    # PP: the boundary activation 2h/(tp*cp) bytes forward and back, NVLink vs network.
    pp_bytes = 2 * 2 * h / 2
    pp_extra_s = pp_bytes / inter - pp_bytes / intra
    assert narrow[(2, 4, 1)].b - wide[(2, 4, 1)].b == pytest.approx(pp_extra_s)
    # CP (ring attention): 3 x (cp-1)/cp x K,V bytes / tp per layer, NVLink vs network.
    cp_bytes = layers * 3 * (1 / 2) * (2 * kv_dim * 2 / 4)
    cp_extra_s = cp_bytes / inter - cp_bytes / intra
    assert narrow[(4, 1, 2)].b - wide[(4, 1, 2)].b == pytest.approx(cp_extra_s)


def test_full_recompute_trades_time_for_capacity() -> None:
    model, gpu = get_model("llama3-8b"), get_gpu("h100-sxm-80gb")
    selective = {entry.key: entry for entry in build_profile(model, gpu, 8, 8).schemes}
    full_options = AnalyticOptions(recompute="full")
    full = {entry.key: entry for entry in build_profile(model, gpu, 8, 8, full_options).schemes}
    for key in [(8, 1, 1), (4, 2, 1)]:
        assert full[key].capacity_tokens > selective[key].capacity_tokens
        assert full[key].b > selective[key].b
        assert full[key].a > selective[key].a


def test_eager_attention_adds_quadratic_memory() -> None:
    model, gpu = get_model("llama2-7b"), get_gpu("a100-80gb")
    eager = AnalyticOptions(recompute="none", flash_attention=False)
    eager_schemes = {entry.key: entry for entry in build_profile(model, gpu, 8, 8, eager).schemes}
    flash_schemes = {entry.key: entry for entry in build_profile(model, gpu, 8, 8).schemes}
    assert eager_schemes[(8, 1, 1)].activation_bytes_per_token_sq > 0
    assert flash_schemes[(8, 1, 1)].activation_bytes_per_token_sq == 0
    assert eager_schemes[(8, 1, 1)].capacity_tokens < flash_schemes[(8, 1, 1)].capacity_tokens


def test_model_that_does_not_fit_raises_a_clear_error() -> None:
    with pytest.raises(ValueError) as caught:
        build_profile(get_model("llama3-70b"), get_gpu("a100-40gb"), 8, 8)
    message = str(caught.value)
    assert message.startswith("llama3-70b does not fit in 8 x a100-40gb: ")
    assert "GiB static memory per GPU of 37.3 GiB" in message


def test_bad_cluster_and_options_are_rejected() -> None:
    model, gpu = get_model("tiny"), get_gpu("h100-sxm-80gb")
    with pytest.raises(ValueError, match="not a multiple of gpus_per_node 8"):
        build_profile(model, gpu, 12, 8)
    with pytest.raises(ValueError, match="matmul_efficiency"):
        AnalyticOptions(matmul_efficiency=1.5)
    with pytest.raises(ValueError, match="recompute"):
        AnalyticOptions(recompute="some")  # type: ignore[arg-type]


def test_profile_passes_through_the_planner_cost_model(llama3_8b_profile: CostProfile) -> None:
    cost_model = ProfileCostModel(llama3_8b_profile)
    scheme = ParallelScheme(4, 2, 1)
    entry = next(item for item in llama3_8b_profile.schemes if item.key == (4, 2, 1))
    lengths = [1000, 3000, 500]
    expected = entry.a * (1000**2 + 3000**2 + 500**2) + entry.b * 4500 + entry.c
    assert cost_model.stage_time_s(scheme, lengths) == pytest.approx(expected)
    assert cost_model.capacity_tokens(scheme) == entry.capacity_tokens
    assert cost_model.fwd_fraction(scheme) == pytest.approx(1 / 3)
    sync_s = cost_model.grad_sync_s([scheme] * 8)
    # one <4,2,1> replica per node: its all-reduce runs on one NIC, at the catalog's 92% of 400 Gb/s
    assert entry.grad_sync_bandwidth_bytes_per_s == pytest.approx(0.92 * 50e9)
    assert sync_s == pytest.approx(2 * 7 / 8 * entry.grad_bytes_per_gpu / (0.92 * 50e9))
    assert 0.05 < cost_model.stage_time_s(ParallelScheme(8, 1, 1), [8192]) < 1.0


@settings(max_examples=25, deadline=None)
@given(
    num_nodes=st.sampled_from([1, 2, 4]),
    gpus_per_node=st.sampled_from([1, 2, 4, 8]),
    max_cp=st.sampled_from([1, 2, 4, 16]),
    gpu_name=st.sampled_from(["a100-40gb", "h100-sxm-80gb"]),
)
def test_every_candidate_fits_or_is_dropped(num_nodes: int, gpus_per_node: int, max_cp: int, gpu_name: str) -> None:
    model, gpu = get_model("tiny"), get_gpu(gpu_name)
    num_gpus = num_nodes * gpus_per_node
    options = AnalyticOptions(max_cp=max_cp)
    profile = build_profile(model, gpu, num_gpus, gpus_per_node, options)
    candidates = candidate_schemes(model, num_gpus, gpus_per_node, max_cp)
    keys = [(entry.tp, entry.pp, entry.cp) for entry in profile.schemes]
    assert keys == [(s.tp, s.pp, s.cp) for s in candidates]  # tiny always fits
    for entry in profile.schemes:
        assert math.log2(entry.cp).is_integer() and entry.cp <= max_cp
        assert gpus_per_node % entry.tp == 0
        assert entry.static_bytes is not None and entry.static_bytes < gpu.memory_bytes
