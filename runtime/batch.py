"""Packed variable-length micro-batches: many sequences in one token stream, no attention across them.

A micro-batch of k sequences with lengths `l_1..l_k` is one stream of `T = sum l_i` tokens.
`cu_seqlens` (cumulative lengths, `[0, l_1, l_1+l_2, ..., T]`) says where each sequence starts, and
`position_ids` restart at 0 for every sequence, so rotary embeddings see each sequence on its own.

Every token has a label: a sequence of length l is drawn as l+1 tokens of one document, the
input is the first l and the labels the last l (next-token prediction, as Megatron-LM forms its
samples). A label of `IGNORE_INDEX` is skipped by the loss (for real data that ends early).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

__all__ = ["IGNORE_INDEX", "CpLayout", "PackedBatch", "chunk_bounds"]

IGNORE_INDEX = -100


def chunk_bounds(length: int, num_chunks: int) -> list[int]:
    """Boundaries of `num_chunks` near-equal chunks of `length` tokens: `[0, ..., length]`.

    Chunk i is `[length * i // n, length * (i + 1) // n)`; sizes differ by at most one token and a
    sequence shorter than `num_chunks` gets empty chunks.
    """
    return [length * index // num_chunks for index in range(num_chunks + 1)]


@dataclass(frozen=True)
class CpLayout:
    """Where a context-parallel rank's tokens sit in the full sequences of its micro-batch.

    Each sequence is cut into `2*cp` chunks (`chunk_bounds`); rank r holds chunks r and
    `2*cp-1-r` of every sequence, in that order, sequence after sequence. That pairs an early
    (cheap) chunk with a late (expensive) one, so causal attention work is balanced across ranks
    (the load-balanced layout of Megatron-LM's context parallelism and of Llama 3 training,
    Llama Team 2024, arXiv 2407.21783, section 3.3.2).
    """

    cp: int
    rank: int
    full_lengths: tuple[int, ...]

    def chunks_of(self, rank: int) -> tuple[int, int]:
        """The two chunk indices rank `rank` holds."""
        return rank, 2 * self.cp - 1 - rank

    def local_lengths(self, rank: int) -> tuple[int, ...]:
        """Tokens of each sequence that rank `rank` holds."""
        sizes = []
        for length in self.full_lengths:
            bounds = chunk_bounds(length, 2 * self.cp)
            sizes.append(sum(bounds[chunk + 1] - bounds[chunk] for chunk in self.chunks_of(rank)))
        return tuple(sizes)

    def local_token_indices(self, rank: int) -> list[int]:
        """Indices, in the full packed stream, of the tokens rank `rank` holds (in its order)."""
        indices: list[int] = []
        start = 0
        for length in self.full_lengths:
            bounds = chunk_bounds(length, 2 * self.cp)
            for chunk in self.chunks_of(rank):
                indices.extend(range(start + bounds[chunk], start + bounds[chunk + 1]))
            start += length
        return indices


@dataclass(frozen=True)
class PackedBatch:
    """One packed micro-batch (tensors on one device).

    `input_ids`, `labels`, `position_ids`: `[T]` long; `cu_seqlens`: `[k+1]` int32; `lengths`: the
    k sequence lengths as Python ints (no device sync needed to read them). Under context
    parallelism (`cp_shard`) a rank's batch holds only its chunks: `lengths` are its local token
    counts per sequence, `position_ids` the tokens' positions in their full sequence, and
    `cp_layout` says where every rank's tokens belong.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: tuple[int, ...]
    cp_layout: CpLayout | None = None

    @property
    def num_tokens(self) -> int:
        return int(sum(self.lengths))

    @property
    def num_label_tokens(self) -> int:
        """Tokens the loss counts (labels not `IGNORE_INDEX`): the caller divides by their sum."""
        return int((self.labels != IGNORE_INDEX).sum())

    @classmethod
    def from_token_sequences(cls, sequences: Sequence[torch.Tensor], device: str | torch.device = "cpu") -> PackedBatch:
        """Pack documents of l+1 token ids each into sequences of length l (input and next-token labels)."""
        if not sequences:
            raise ValueError("a micro-batch needs at least one sequence")
        inputs, labels, positions, lengths = [], [], [], []
        for index, tokens in enumerate(sequences):
            tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
            if tokens.numel() < 2:
                raise ValueError(f"sequence {index}: needs at least 2 tokens (input and label), got {tokens.numel()}")
            inputs.append(tokens[:-1])
            labels.append(tokens[1:])
            positions.append(torch.arange(tokens.numel() - 1, dtype=torch.long))
            lengths.append(tokens.numel() - 1)
        return cls._assemble(torch.cat(inputs), torch.cat(labels), torch.cat(positions), tuple(lengths), device)

    @classmethod
    def from_lengths(
        cls, lengths: Sequence[int], vocab_size: int, seed: int, device: str | torch.device = "cpu"
    ) -> PackedBatch:
        """Synthetic tokens, uniform over the vocabulary, deterministic for `seed` (drawn on the CPU)."""
        checked = []
        for index, length in enumerate(lengths):
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ValueError(f"lengths[{index}]: a positive integer is required, got {length!r}")
            checked.append(length)
        if not checked:
            raise ValueError("a micro-batch needs at least one sequence")
        if vocab_size < 1:
            raise ValueError(f"vocab_size: a positive integer is required, got {vocab_size!r}")
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, vocab_size, (sum(checked) + len(checked),), generator=generator)
        return cls.from_token_sequences(list(torch.split(tokens, [length + 1 for length in checked])), device)

    @classmethod
    def _assemble(
        cls,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        position_ids: torch.Tensor,
        lengths: tuple[int, ...],
        device: str | torch.device,
        cp_layout: CpLayout | None = None,
    ) -> PackedBatch:
        cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0).to(torch.int32)
        return cls(
            input_ids=input_ids.to(device),
            labels=labels.to(device),
            position_ids=position_ids.to(device),
            cu_seqlens=cu_seqlens.to(device),
            lengths=lengths,
            cp_layout=cp_layout,
        )

    def to(self, device: str | torch.device) -> PackedBatch:
        """The same batch on `device`."""
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            labels=self.labels.to(device),
            position_ids=self.position_ids.to(device),
            cu_seqlens=self.cu_seqlens.to(device),
        )

    def cp_shard(self, cp_rank: int, cp: int) -> PackedBatch:
        """The tokens context-parallel rank `cp_rank` of `cp` holds (see `CpLayout`)."""
        if self.cp_layout is not None:
            raise ValueError("this batch is already a context-parallel shard")
        if cp < 1 or not 0 <= cp_rank < cp:
            raise ValueError(f"cp_rank {cp_rank} is not a rank of cp={cp}")
        layout = CpLayout(cp=cp, rank=cp_rank, full_lengths=self.lengths)
        index = torch.tensor(layout.local_token_indices(cp_rank), dtype=torch.long, device=self.input_ids.device)
        return PackedBatch._assemble(
            self.input_ids[index],
            self.labels[index],
            self.position_ids[index],
            layout.local_lengths(cp_rank),
            self.input_ids.device,
            cp_layout=layout,
        )


def cp_shard(batch: PackedBatch, cp_rank: int, cp: int) -> PackedBatch:
    """Function form of `PackedBatch.cp_shard` (the name the parallel layers document)."""
    return batch.cp_shard(cp_rank, cp)
