"""Tensor and context parallelism against one process, on 2 gloo ranks (one launch, several scenarios).

Starting torch ranks is slow here, so one `run_ranks` call runs every distributed scenario and
returns what each rank computed; the tests compare it with the single-process model in float64.
"""

from __future__ import annotations

import math

import pytest

from tests.runtime_support import require_torch

torch = require_torch()

import torch.distributed as dist  # noqa: E402

from hydraplan.runtime.collectives import measure_collectives  # noqa: E402
from hydraplan.runtime.launch import RankFailedError, RankTimeoutError, run_ranks  # noqa: E402
from hydraplan.runtime.model import ModelConfig, PackedBatch, build_stage  # noqa: E402
from hydraplan.runtime.parallel import cp_shard, parallelize_stage, parameter_slices, reduce_replica_grads  # noqa: E402

pytestmark = pytest.mark.runtime

# Odd vocabulary and MLP widths: the TP shards are uneven (32/33 rows), as any tp may make them.
SHAPE = dict(num_layers=2, hidden_size=32, ffn_hidden_size=50, num_heads=4, num_kv_heads=2, vocab_size=65)
LENGTHS = [5, 9, 2, 7]  # not multiples of 2*cp: uneven CP chunks and padded all-gathers
SEED, DATA_SEED = 1, 3
COLLECTIVE_SIZES = (64, 4096)


def config(tied: bool = False) -> ModelConfig:
    return ModelConfig.from_catalog("tiny", **SHAPE, tied_embeddings=tied)


def batch() -> PackedBatch:
    return PackedBatch.from_lengths(LENGTHS, SHAPE["vocab_size"], seed=DATA_SEED)


def grads_of(module) -> dict:
    return {name: parameter.grad.clone() for name, parameter in module.named_parameters()}


def tensor_parallel(tied: bool) -> dict:
    stage = build_stage(config(tied), seed=SEED, dtype=torch.float64)
    parallelize_stage(stage, tp=2, cp=1, tp_group=dist.group.WORLD, cp_group=None)
    loss = stage(batch())
    loss.backward()
    return {"loss": loss.item(), "grads": grads_of(stage), "slices": parameter_slices(stage)}


def context_parallel(rank: int, pp: int) -> dict:
    """cp=2 on the whole model (summed loss, summed gradients) or on stage 0 of pp=2 (hidden)."""
    stage = build_stage(config(), pp=pp, stage=0, seed=SEED, dtype=torch.float64)
    parallelize_stage(stage, tp=1, cp=2, tp_group=None, cp_group=dist.group.WORLD)
    shard = cp_shard(batch(), rank, 2)
    out = stage(shard)
    if pp == 2:
        return {"hidden": out.detach(), "index": shard.cp_layout.local_token_indices(rank)}
    out.backward()
    total = out.detach().clone()
    dist.all_reduce(total)
    reduce_replica_grads(stage, dist.group.WORLD)
    return {"loss": total.item(), "own_loss": out.item(), "grads": grads_of(stage)}


def collective_counts(rank: int, tp: int, cp: int) -> dict:
    """One micro-batch of the whole model under `<tp,1,cp>` on the 2 ranks, its collectives
    counted by the instrumented `torch.distributed` (`runtime.comm_count`), beside the closed form."""
    from hydraplan.runtime.comm_count import expected_for, stage_counts

    stage = build_stage(config(), seed=SEED, dtype=torch.float64)
    world = dist.group.WORLD
    parallelize_stage(stage, tp=tp, cp=cp, tp_group=world if tp > 1 else None, cp_group=world if cp > 1 else None)
    cp_rank = rank if cp > 1 else 0
    return {
        "measured": stage_counts(stage, batch(), cp_rank, cp),
        "closed_form": expected_for(config(), batch(), tp, cp, cp_rank, torch.float64),
    }


def scenarios(rank: int, world_size: int) -> dict:
    assert world_size == 2
    return {
        "counts_tp": collective_counts(rank, tp=2, cp=1),
        "counts_cp": collective_counts(rank, tp=1, cp=2),
        "tp": tensor_parallel(tied=False),
        "tp_tied": tensor_parallel(tied=True),
        "cp": context_parallel(rank, pp=1),
        "cp_stage": context_parallel(rank, pp=2),
        "collectives": measure_collectives(sizes_bytes=COLLECTIVE_SIZES, repeats=2),
    }


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_ranks(scenarios, 2, timeout_s=240.0)


@pytest.mark.parametrize("scenario", ["counts_tp", "counts_cp"])
def test_collectives_per_micro_batch_equal_the_megatron_closed_form(ranks, scenario):
    for rank in ranks:
        assert rank[scenario]["measured"] == rank[scenario]["closed_form"], rank[scenario]


def test_tensor_parallelism_all_reduces_twice_forward_and_twice_backward_per_layer(ranks):
    # 2 layers: 4 block outputs + the embedding forward, + 3 token-sized loss reductions; 4 block
    # inputs + the LM head input backward (Megatron-LM's f/g; 9 backward before the f moved to the
    # block inputs: one per column-parallel linear)
    tokens, hidden = sum(LENGTHS), SHAPE["hidden_size"]
    for rank in ranks:
        measured = rank["counts_tp"]["measured"]
        assert measured["forward"] == {"all_reduce": (8, 5 * tokens * hidden * 8 + 3 * tokens * 8)}
        assert measured["backward"] == {"all_reduce": (5, 5 * tokens * hidden * 8)}
        cp_measured = rank["counts_cp"]["measured"]
        assert set(cp_measured["forward"]) == {"all_gather"} and set(cp_measured["backward"]) == {"reduce_scatter"}
        assert cp_measured["forward"]["all_gather"][0] == cp_measured["backward"]["reduce_scatter"][0] == 4


def single_process(tied: bool = False):
    stage = build_stage(config(tied), seed=SEED, dtype=torch.float64)
    loss = stage(batch())
    loss.backward()
    return loss.item(), grads_of(stage)


@pytest.mark.parametrize("scenario", ["tp", "tp_tied"])
def test_tensor_parallel_loss_and_gradient_shards_equal_one_process(ranks, scenario):
    loss, grads = single_process(tied=scenario == "tp_tied")
    for rank in range(2):
        result = ranks[rank][scenario]
        assert result["loss"] == pytest.approx(loss, rel=1e-12)
        assert sorted(result["grads"]) == sorted(grads)
        for name, shard_grad in result["grads"].items():
            expected = grads[name][result["slices"][name]]
            assert shard_grad.shape == expected.shape, name
            assert torch.allclose(shard_grad, expected, rtol=1e-9, atol=1e-12), (rank, name)
    # The two ranks hold different halves of the sharded weights (uneven: 32 and 33 vocabulary rows).
    slices = [ranks[rank][scenario]["slices"] for rank in range(2)]
    assert slices[0]["layers.0.attn.wq.weight"][0] == slice(0, 16)
    assert slices[1]["layers.0.attn.wk.weight"][0] == slice(8, 16)
    assert slices[1]["embed.weight"][0] == slice(32, 65)
    assert slices[0]["layers.1.mlp_norm.weight"] == (slice(None),)


def test_context_parallel_sums_to_the_one_process_loss_and_gradients(ranks):
    loss, grads = single_process()
    own = [ranks[rank]["cp"]["own_loss"] for rank in range(2)]
    assert sum(own) == pytest.approx(loss, rel=1e-12)
    assert all(value > 0 for value in own)  # each rank summed only its own tokens
    for rank in range(2):
        result = ranks[rank]["cp"]
        assert result["loss"] == pytest.approx(loss, rel=1e-12)
        for name, grad in grads.items():
            assert torch.allclose(result["grads"][name], grad, rtol=1e-9, atol=1e-12), (rank, name)


def test_context_parallel_stage_hidden_states_are_the_one_process_rows(ranks):
    hidden = build_stage(config(), pp=2, stage=0, seed=SEED, dtype=torch.float64)(batch()).detach()
    covered = []
    for rank in range(2):
        result = ranks[rank]["cp_stage"]
        assert torch.allclose(result["hidden"], hidden[result["index"]], rtol=0, atol=1e-12)
        covered += result["index"]
    assert sorted(covered) == list(range(sum(LENGTHS)))


def test_collective_measurements_are_sane_rows(ranks):
    rows = ranks[0]["collectives"]
    assert [(row["op"], row["bytes"]) for row in rows] == [
        (op, size) for op in ("all_reduce", "all_gather", "send_recv") for size in COLLECTIVE_SIZES
    ]
    for row in rows:
        assert row["ranks"] == 2
        assert math.isfinite(row["seconds"]) and 0 < row["seconds"] < 10, row
    assert ranks[1]["collectives"] == rows  # every rank reports the slowest rank's times


def fail_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("broken on purpose")
    dist.barrier()  # rank 0 would wait here for ever: run_ranks must stop it


def test_a_failing_rank_is_named_and_the_others_are_stopped():
    with pytest.raises(RankFailedError, match=r"rank 1 failed: ValueError: broken on purpose") as failure:
        run_ranks(fail_on_rank_one, 2, timeout_s=60.0)
    assert failure.value.rank == 1 and "fail_on_rank_one" in failure.value.traceback_text


def exit_without_a_word(rank: int, world_size: int) -> None:
    import os

    os._exit(3)


def sleep_for_ever(rank: int, world_size: int) -> None:
    import time

    time.sleep(3600)


def test_a_rank_that_dies_silently_is_named_with_its_exit_code():
    with pytest.raises(RankFailedError, match=r"rank 0 failed: exited with code 3 without a result"):
        run_ranks(exit_without_a_word, 1, timeout_s=60.0)


def test_nothing_waits_past_the_timeout():
    # 3 s: the rank is stopped while it still starts (imports torch) or sleeps; either way it is named.
    with pytest.raises(RankTimeoutError, match=r"ranks \[0\] did not finish within 3 s"):
        run_ranks(sleep_for_ever, 1, timeout_s=3.0)


def test_run_ranks_refuses_bad_arguments():
    with pytest.raises(ValueError, match="backend 'mpi'"):
        run_ranks(fail_on_rank_one, 2, backend="mpi")
    with pytest.raises(ValueError, match="nproc"):
        run_ranks(fail_on_rank_one, 0)
