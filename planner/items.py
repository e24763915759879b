"""Turning a request's lengths into the items the solver places (whole sequences or chunks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydraplan.planner.errors import PlanningError
from hydraplan.planner.limits import MAX_ITEMS
from hydraplan.planner.schemas import OversizePolicy


@dataclass(frozen=True)
class Items:
    """What the solver places: item `k` is tokens `[offsets[k], offsets[k] + lengths[k])` of
    input sequence `sequence_ids[k]`. Arrays are aligned and in input order."""

    sequence_ids: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    dropped_sequence_ids: tuple[int, ...] = ()
    split_sequence_ids: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


def prepare_items(lengths: list[int], max_capacity_tokens: int, policy: OversizePolicy) -> Items:
    """Apply the oversize policy to sequences longer than every scheme's capacity.

    `split` cuts such a sequence into capacity-sized chunks plus a remainder (training data
    pipelines do the same at the context cap); `drop` leaves it out and lists its id; `error`
    refuses the batch, saying how many and the largest capacity.
    """
    as_array = np.asarray(lengths, dtype=np.int64)
    oversize = np.flatnonzero(as_array > max_capacity_tokens)
    if len(oversize) == 0:
        identity = np.arange(len(as_array), dtype=np.int64)
        return Items(identity, np.zeros_like(identity), as_array)
    if policy == OversizePolicy.ERROR:
        longest = int(oversize[np.argmax(as_array[oversize])])
        raise PlanningError(
            f"{len(oversize)} sequence(s) exceed the largest capacity of any scheme, "
            f"{max_capacity_tokens} tokens (longest: id {longest}, {int(as_array[longest])} tokens); "
            "use oversize policy 'split' or 'drop'"
        )
    # vectorised (a batch may hold millions of sequences): each sequence becomes ceil(l / cap)
    # pieces under `split`, none under `drop` for the oversize ones, and itself otherwise
    if policy == OversizePolicy.SPLIT:
        pieces = np.where(as_array > max_capacity_tokens, -(-as_array // max_capacity_tokens), 1)
    else:
        pieces = np.where(as_array > max_capacity_tokens, 0, 1)
    num_items = int(pieces.sum())
    if num_items > MAX_ITEMS:  # counted before any chunk is made
        raise PlanningError(
            f"splitting at the largest capacity, {max_capacity_tokens} tokens, makes {num_items} chunks, "
            f"more than the limit of {MAX_ITEMS} items"
        )
    sequence_ids = np.repeat(np.arange(len(as_array), dtype=np.int64), pieces)
    first_piece = np.cumsum(pieces) - pieces  # index of each sequence's first piece
    offsets = (np.arange(len(sequence_ids), dtype=np.int64) - first_piece[sequence_ids]) * max_capacity_tokens
    item_lengths = np.minimum(as_array[sequence_ids] - offsets, max_capacity_tokens)
    if len(item_lengths) == 0:
        raise PlanningError(
            f"all {len(as_array)} sequences exceed the largest capacity {max_capacity_tokens} "
            "tokens and were dropped: nothing left to plan"
        )
    dropped = tuple(oversize.tolist()) if policy == OversizePolicy.DROP else ()
    split = tuple(oversize.tolist()) if policy == OversizePolicy.SPLIT else ()
    return Items(
        sequence_ids,
        offsets,
        item_lengths.astype(np.int64),
        dropped_sequence_ids=dropped,
        split_sequence_ids=split,
    )
