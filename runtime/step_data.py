"""The tokens of a step: deterministic synthetic documents, cut into the plan's micro-batches.

Sequence `i` of step `k` (length `l`, the plan's `input_lengths[i]`) is `l + 1` tokens drawn
uniformly from the vocabulary by a generator seeded from `(data_seed, k, i)` alone, so every rank
of every pipeline, and the single-process check, draw the same document without communicating.
A plan entry `(sequence_id, offset, length)` takes tokens `[offset, offset + length + 1)` of its
document: the inputs are the first `length`, the labels the next-token shift, so the chunks of a
split sequence together predict exactly the sequence's `l` labels. Each entry is its own
sequence in the packed stream (positions restart at 0, no attention across entries; a chunk does
not attend to the chunks before it, as the planner's cost model of a split sequence assumes).

With `--data` the documents come from a token directory instead (`documents`, from
`data_feed.StepFeed`): the same cutting, applied to real documents of `l + 1` tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch

from hydraplan.runtime.assignment import MicroBatchWork
from hydraplan.runtime.batch import PackedBatch

__all__ = ["document_tokens", "micro_batch", "whole_batch"]


def _generator_seed(data_seed: int, step: int, sequence_id: int) -> int:
    digest = hashlib.sha256(f"data/{data_seed}/{step}/{sequence_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def document_tokens(data_seed: int, step: int, sequence_id: int, length: int, vocab_size: int) -> torch.Tensor:
    """The `length + 1` token ids of sequence `sequence_id` in step `step` (int64, CPU)."""
    generator = torch.Generator().manual_seed(_generator_seed(data_seed, step, sequence_id))
    return torch.randint(0, vocab_size, (length + 1,), generator=generator)


def micro_batch(
    work: MicroBatchWork,
    input_lengths: Sequence[int],
    data_seed: int,
    step: int,
    vocab_size: int,
    documents: Callable[[int], torch.Tensor] | None = None,
) -> PackedBatch:
    """The packed micro-batch `work` of step `step` (full, before any CP sharding); `documents`:
    sequence id -> its tokens (real data), else synthetic ones by seed."""
    pieces = []
    for sequence_id, offset, length in zip(work.sequence_ids, work.offsets, work.lengths):
        if documents is None:
            tokens = document_tokens(data_seed, step, sequence_id, input_lengths[sequence_id], vocab_size)
        else:
            tokens = documents(sequence_id)
            assert len(tokens) == input_lengths[sequence_id] + 1, "the feed checked every length"
        pieces.append(tokens[offset : offset + length + 1])
    return PackedBatch.from_token_sequences(pieces)


def whole_batch(
    works: Sequence[MicroBatchWork],
    input_lengths: Sequence[int],
    data_seed: int,
    step: int,
    vocab_size: int,
    documents: Callable[[int], torch.Tensor] | None = None,
) -> PackedBatch:
    """Every entry of `works` in one packed batch (the single-process check's step)."""
    merged = MicroBatchWork(
        index=0,
        sequence_ids=tuple(sequence_id for work in works for sequence_id in work.sequence_ids),
        lengths=tuple(length for work in works for length in work.lengths),
        offsets=tuple(offset for work in works for offset in work.offsets),
    )
    return micro_batch(merged, input_lengths, data_seed, step, vocab_size, documents)
