"""The tokens of each step from a token directory (`--data`), for the ranks and the check.

`StepFeed.open(spec, plans, vocab_size)` opens the directory (memory-mapped), checks every step's
plan against its documents (`token_data.check_batches`: refused before any compute) and gives each
step a `documents(sequence_id)` function: step k's sequence i is document `starts[k] + i`, its
n tokens the n - 1 inputs and their next-token labels (`step_data.micro_batch` cuts the plan's
chunks from it, as from a synthetic document). Every rank reads only the documents of the
micro-batches it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hydraplan.planner.schemas import Plan
from hydraplan.runtime.token_data import TokenDirectory, batch_starts, check_batches

__all__ = ["StepFeed"]


@dataclass(frozen=True)
class StepFeed:
    """The documents of every step of a run."""

    data: TokenDirectory
    starts: tuple[int, ...]  # the first document of each step (by the run's step index)
    next_document: int  # the first document after the run (a checkpoint's data cursor)

    @classmethod
    def open(cls, spec, plans: Sequence[Plan], vocab_size: int) -> StepFeed | None:
        """None without `spec.data_path` (synthetic tokens); else the checked feed."""
        if spec.data_path is None:
            return None
        data = TokenDirectory.open(spec.data_path)
        lengths = [list(plan.input_lengths) for plan in plans]
        next_document = check_batches(data, lengths, spec.data_start, vocab_size, spec.first_step)
        starts = batch_starts([len(each) for each in lengths], spec.data_start)
        return cls(data, tuple(starts), next_document)

    def documents(self, index: int) -> Callable[[int], torch.Tensor]:
        """Sequence id -> its document's tokens (int64), for the run's step `index`."""
        first = self.starts[index]

        def document(sequence_id: int) -> torch.Tensor:
            return torch.from_numpy(np.asarray(self.data.document(first + sequence_id), dtype=np.int64))

        return document
