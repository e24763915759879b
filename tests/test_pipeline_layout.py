"""Pipeline layouts (cost_models/pipeline_layout.py) and the per-rank memory model built on them,
against values worked out by hand from Megatron-LM's schedules."""

from __future__ import annotations

import pytest

from hydraplan.cost_models.analytic import (
    AnalyticOptions,
    activation_coefficients,
    scheme_memory,
    static_bytes,
)
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.cost_models.pipeline_layout import chunk_layers, in_flight_micro_batches
from hydraplan.planner.schemas import most_tokens
from hydraplan.planner.scheme import ParallelScheme


def test_even_split_gives_every_chunk_the_same_layers() -> None:
    assert chunk_layers(32, 4) == [[8], [8], [8], [8]]
    assert chunk_layers(32, 4, 2) == [[4, 4]] * 4


def test_embedding_and_loss_take_a_layer_slot_each() -> None:
    # Llama 3 405B: 126 layers + embedding + loss = 128 slots, 8 per rank, one per chunk at v = 8;
    # "the first model chunk on the first stage has only the embedding" (Llama 3 §3.3.2)
    layers = chunk_layers(126, 16, 8, "embedding-and-loss")
    assert layers[0] == [0, 1, 1, 1, 1, 1, 1, 1]
    assert layers[-1] == [1, 1, 1, 1, 1, 1, 1, 0]
    assert all(row == [1] * 8 for row in layers[1:-1])
    assert sum(map(sum, layers)) == 126
    # without interleaving: 7 layers on the first and last rank, 8 on the others
    assert [sum(row) for row in chunk_layers(126, 16, 1, "embedding-and-loss")] == [7] + [8] * 14 + [7]


@pytest.mark.parametrize(
    ("layers", "pp", "chunks", "split"),
    [(30, 4, 1, "even"), (32, 4, 3, "even"), (126, 16, 1, "even"), (32, 4, 1, "embedding-and-loss")],
)
def test_splits_that_do_not_divide_are_refused(layers, pp, chunks, split) -> None:
    with pytest.raises(ValueError, match=f"{layers} layers"):
        chunk_layers(layers, pp, chunks, split)


def test_unknown_split_and_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="'uneven'"):
        chunk_layers(32, 4, 1, "uneven")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="micro_batches must be >= 1, got 0"):
        in_flight_micro_batches(4, 1, 0)
    with pytest.raises(ValueError, match=r"pp \(0\)"):
        in_flight_micro_batches(0)


def test_one_f_one_b_keeps_pp_minus_rank_in_flight() -> None:
    assert in_flight_micro_batches(4) == [[4], [3], [2], [1]]
    assert in_flight_micro_batches(4, micro_batches=2) == [[2], [2], [2], [1]]


def test_interleaved_warm_up_by_hand() -> None:
    # pp 4, v 2: rank 0 runs 2*3 + 1*4 = 10 warm-up forwards and one more, the k-th on chunk
    # (k // 4) % 2: chunks 0,0,0,0,1,1,1,1,0,0,0 -> 7 on chunk 0, 4 on chunk 1; the last rank
    # runs 0 + 4 warm-up forwards and one more: 4 and 1
    counts = in_flight_micro_batches(4, 2)
    assert counts[0] == [7, 4]
    assert counts[1] == [5, 4]  # 2*2 + 4 + 1 = 9 forwards: 0,0,0,0,1,1,1,1,0
    assert counts[2] == [4, 3]  # 2*1 + 4 + 1 = 7 forwards
    assert counts[3] == [4, 1]
    # 4 micro-batches x 2 chunks = 8 forwards in all: rank 0 runs them all before a backward
    assert in_flight_micro_batches(4, 2, micro_batches=4)[0] == [4, 4]


def test_smaller_micro_batch_groups_hold_fewer_in_flight() -> None:
    # Megatron-Core's microbatch_group_size_per_vp_stage G = 2 on pp 4, v 2: rank 0 runs
    # 2*3 + 1*2 = 8 warm-up forwards and one more, the k-th on chunk (k // 2) % 2:
    # 0,0,1,1,0,0,1,1,0 -> 5 and 4; the last rank 0 + 2 and one more: 0,0,1 -> 2 and 1
    counts = in_flight_micro_batches(4, 2, group_size=2)
    assert counts[0] == [5, 4]
    assert counts[3] == [2, 1]
    assert in_flight_micro_batches(4, 2, group_size=4) == in_flight_micro_batches(4, 2)
    with pytest.raises(ValueError, match="group_size must be >= 1, got 0"):
        in_flight_micro_batches(4, 2, group_size=0)


@pytest.mark.parametrize(("pp", "chunks"), [(4, 2), (8, 4), (16, 8)])
def test_rank_zero_holds_korthikantis_interleaving_factor(pp, chunks) -> None:
    # Korthikanti et al. 2022 §4.2.3: interleaving multiplies the first stage's activation memory
    # by 1 + (pp-1)/(pp*v), i.e. pp + (pp-1)/v micro-batches of a rank's layers
    layers = chunk_layers(pp * chunks * 2, pp, chunks)
    held = sum(count * chunk for count, chunk in zip(in_flight_micro_batches(pp, chunks)[0], layers[0]))
    assert held / sum(layers[0]) == pytest.approx(pp + (pp - 1) / chunks)


def _per_rank_capacity(model, gpu, scheme, options, layers_per_rank, in_flight_layers) -> int:
    """The capacity recomputed rank by rank from the model's pieces (no shortcut)."""
    per_token, _ = activation_coefficients(model, scheme.tp, True, options.recompute, True, dropout=False)
    usable = gpu.memory_bytes * (1 - options.memory_reserve_fraction)
    bounds = []
    for rank, (layers, held) in enumerate(zip(layers_per_rank, in_flight_layers)):
        ends = (rank == 0) + (rank == scheme.pp - 1)
        params = layers * model.params_per_layer + ends * model.embedding_params
        logits = 4 * model.vocab_size / scheme.tp if rank == scheme.pp - 1 else 0.0
        free = usable - static_bytes(model, params, scheme.tp, 64, options)
        bounds.append(most_tokens(free, held * per_token + logits, 0.0))
    return min(bounds)


def test_scheme_memory_checks_every_rank_of_the_schedule() -> None:
    model, gpu = get_model("llama3-8b"), get_gpu("h100-sxm-80gb")
    options = AnalyticOptions(min_capacity_tokens=1)
    scheme = ParallelScheme(1, 4, 1)
    # 1F1B, even split: 8 layers per rank, 4, 3, 2, 1 micro-batches in flight
    plain = scheme_memory(model, gpu, scheme, 64, options)
    assert plain.capacity_tokens == _per_rank_capacity(model, gpu, scheme, options, [8] * 4, [32, 24, 16, 8])
    # interleaved, v = 2 (4 layers per chunk): rank 0 holds 7*4 + 4*4 = 44 layer-micro-batches
    interleaved = scheme_memory(model, gpu, scheme, 64, options, virtual_stages=2)
    held = [(7 + 4) * 4, (5 + 4) * 4, (4 + 3) * 4, (4 + 1) * 4]
    assert interleaved.capacity_tokens == _per_rank_capacity(model, gpu, scheme, options, [8] * 4, held)
    assert interleaved.capacity_tokens < plain.capacity_tokens
    # 30 layers + embedding + loss: 7, 8, 8, 7 layers; in flight 4*7, 3*8, 2*8, 1*7
    thirty = model.model_copy(update={"num_layers": 30})
    split = scheme_memory(thirty, gpu, scheme, 64, options, split="embedding-and-loss")
    expected = _per_rank_capacity(thirty, gpu, scheme, options, [7, 8, 8, 7], [28, 24, 16, 7])
    assert split.capacity_tokens == expected
