"""The tokens of each step from a token directory (`--data`), for the ranks and the check.

`StepFeed.open(spec, vocab_size)` opens the directory (memory-mapped); `feed.documents(plan)`,
called once per step in order, checks that step's plan against the next documents
(`token_data.check_batches`: refused before the step's compute; `hydraplan run` has checked every
plan file before any rank started) and gives a `documents(sequence_id)` function: the step's
sequence i is the document `cursor + i`, its n tokens the n - 1 inputs and their next-token labels
(`step_data.micro_batch` cuts the plan's chunks from it, as from a synthetic document). The cursor
then moves past the step's documents, so plans may come all at once or one step at a time (online
planning). Every rank reads only the documents of the micro-batches it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hydraplan.planner.schemas import Plan
from hydraplan.runtime.token_data import TokenDirectory, check_batches

__all__ = ["StepFeed"]


@dataclass
class StepFeed:
    """The documents of the steps of a run, step after step."""

    data: TokenDirectory
    vocab_size: int
    next_document: int  # the first document of the next step (after the run: a checkpoint's data cursor)
    next_step: int  # that step's number (for the messages)

    @classmethod
    def open(cls, spec, vocab_size: int) -> StepFeed | None:
        """None without `spec.data_path` (synthetic tokens); else the feed at the run's first document."""
        if spec.data_path is None:
            return None
        return cls(TokenDirectory.open(spec.data_path), vocab_size, spec.data_start, spec.first_step)

    def documents(self, plan: Plan) -> Callable[[int], torch.Tensor]:
        """Sequence id -> its document's tokens (int64) for the next step, whose plan this is."""
        first = self.next_document
        lengths = [list(plan.input_lengths)]
        self.next_document = check_batches(self.data, lengths, first, self.vocab_size, self.next_step)
        self.next_step += 1
        data = self.data

        def document(sequence_id: int) -> torch.Tensor:
            return torch.from_numpy(np.asarray(data.document(first + sequence_id), dtype=np.int64))

        return document
