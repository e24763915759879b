"""Which layers each pipeline rank holds and how many micro-batches' activations it keeps at its
peak: the inputs of the per-rank memory model (`analytic.scheme_memory`).

A pipeline of `pp` ranks runs `v` model chunks per rank (`v = 1`: plain 1F1B). Chunk `j` of rank
`r` is virtual stage `j*pp + r` (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", §2.2.2: rank 0 runs stages 0 and pp, rank 1 stages 1
and pp+1, ...).

Layer splits:

- `even`: every virtual stage holds `num_layers / (pp*v)` layers; the embedding sits on the first
  rank and the LM head on the last on top of their layers (Megatron-LM's default);
- `embedding-and-loss`: the embedding and the loss each take one layer's slot, so `num_layers + 2`
  slots are split evenly and the first and last virtual stages hold one layer fewer
  (Megatron-Core's `account_for_embedding_in_pipeline_split` and
  `account_for_loss_in_pipeline_split`; Llama 3 405B's 126 layers on 16 ranks, Llama Team 2024,
  "The Llama 3 Herd of Models", §3.3.2).

Micro-batches in flight at a rank's peak, `m` per step:

- 1F1B: rank `r` runs `pp - r - 1` warm-up forwards, then one forward before its first backward:
  `min(pp - r, m)` (Narayanan et al. 2021 §2.2.1);
- interleaved 1F1B: `2*(pp - r - 1) + (v - 1)*G` warm-up forwards (capped at `m*v`), plus one;
  the k-th forward of a rank runs chunk `(k // G) % v`, micro-batches going through the chunks
  in groups of `G` (Megatron-LM `forward_backward_pipelining_with_interleaving`,
  megatron/core/pipeline_parallel/schedules.py; `G` is Megatron-Core's
  `microbatch_group_size_per_vp_stage`, `pp` by default). With `G = pp` rank 0 holds
  `pp + (pp - 1)/v` micro-batches' worth of a rank's layers, the `1 + (pp-1)/(pp*v)` factor of
  Korthikanti et al. 2022 §4.2.3. A group smaller than `pp` holds less but stalls the pipeline
  (a chunk's micro-batch returns to rank 0 only after `pp` steps); that bubble is not priced here.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["PIPELINE_SPLITS", "PipelineSplit", "chunk_layers", "in_flight_micro_batches"]

PipelineSplit = Literal["even", "embedding-and-loss"]
PIPELINE_SPLITS = ("even", "embedding-and-loss")


def chunk_layers(num_layers: int, pp: int, virtual_stages: int = 1, split: PipelineSplit = "even") -> list[list[int]]:
    """Transformer layers of every (rank, chunk): `result[r][j]` for chunk j of rank r."""
    if split not in PIPELINE_SPLITS:
        raise ValueError(f"pipeline split must be one of {', '.join(PIPELINE_SPLITS)}, got {split!r}")
    if pp < 1 or virtual_stages < 1:
        raise ValueError(f"pp ({pp}) and virtual_stages ({virtual_stages}) must be >= 1")
    slots = num_layers + (2 if split == "embedding-and-loss" else 0)
    chunks = pp * virtual_stages
    if slots % chunks:
        raise ValueError(
            f"{num_layers} layers ({split} split, {slots} slots) do not divide into {pp} ranks x "
            f"{virtual_stages} chunks"
        )
    layers = [[slots // chunks] * virtual_stages for _ in range(pp)]
    if split == "embedding-and-loss":
        layers[0][0] -= 1
        layers[-1][-1] -= 1
    if min(min(row) for row in layers) < 0:
        raise ValueError(f"{num_layers} layers leave a chunk with a negative layer count ({split} split)")
    return layers


def in_flight_micro_batches(
    pp: int, virtual_stages: int = 1, micro_batches: int | None = None, group_size: int | None = None
) -> list[list[int]]:
    """Micro-batches each (rank, chunk) holds activations of at the rank's peak (module
    docstring); `micro_batches` None: as many as the schedule can keep in flight; `group_size`
    None: `pp` (the interleaved schedule's default)."""
    if pp < 1 or virtual_stages < 1:
        raise ValueError(f"pp ({pp}) and virtual_stages ({virtual_stages}) must be >= 1")
    if micro_batches is not None and micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    if group_size is not None and group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    group = pp if group_size is None else group_size
    if virtual_stages == 1:
        return [[pp - rank if micro_batches is None else min(pp - rank, micro_batches)] for rank in range(pp)]
    total = None if micro_batches is None else micro_batches * virtual_stages
    counts = []
    for rank in range(pp):
        peak = 2 * (pp - rank - 1) + (virtual_stages - 1) * group + 1
        if total is not None:
            peak = min(peak, total)
        row = [0] * virtual_stages
        for forward in range(peak):
            row[(forward // group) % virtual_stages] += 1
        counts.append(row)
    return counts
