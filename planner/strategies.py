"""Strategies (multisets of pipelines covering all GPUs) and their placement on ranks."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hydraplan.planner.scheme import ParallelScheme


@dataclass(frozen=True)
class Strategy:
    """How many pipelines of each scheme; canonical order: largest TP*CP grid, then size."""

    counts: tuple[tuple[ParallelScheme, int], ...]

    @classmethod
    def of(cls, counts: dict[ParallelScheme, int] | Sequence[tuple[ParallelScheme, int]]) -> Strategy:
        items = counts.items() if isinstance(counts, dict) else counts
        merged: dict[ParallelScheme, int] = {}
        for scheme, count in items:
            if count < 0:
                raise ValueError(f"strategy count for {scheme} must be >= 0, got {count}")
            if count:
                merged[scheme] = merged.get(scheme, 0) + count
        if not merged:
            raise ValueError("a strategy needs at least one pipeline")
        return cls(tuple(sorted(merged.items(), key=lambda item: placement_key(item[0]))))

    @property
    def num_gpus(self) -> int:
        return sum(scheme.num_gpus * count for scheme, count in self.counts)

    @property
    def num_pipelines(self) -> int:
        return sum(count for _, count in self.counts)

    @property
    def schemes(self) -> list[ParallelScheme]:
        return [scheme for scheme, _ in self.counts]

    def pipeline_schemes(self) -> list[ParallelScheme]:
        """One entry per pipeline, in placement order."""
        return [scheme for scheme, count in self.counts for _ in range(count)]

    def __str__(self) -> str:
        return " + ".join(f"{count}x{scheme}" for scheme, count in self.counts)


_TERM = re.compile(r"^\s*(\d+)\s*[x*]\s*(<[^>]*>)\s*$")


def parse_strategy(text: str) -> Strategy:
    """Parse `1x<8,1,2> + 6x<4,2,1>`."""
    counts = []
    for term in text.split("+"):
        match = _TERM.match(term)
        if not match:
            raise ValueError(f"strategy term {term.strip()!r} is not of the form COUNTx<tp,pp,cp>")
        counts.append((ParallelScheme.parse(match.group(2)), int(match.group(1))))
    return Strategy.of(counts)


def placement_key(scheme: ParallelScheme) -> tuple[int, int, int, int, int]:
    """Pipelines with larger TP*CP grids first, so every grid starts at a multiple of its size."""
    return (-scheme.gpus_per_stage, -scheme.num_gpus, -scheme.tp, scheme.pp, scheme.cp)


@dataclass(frozen=True)
class Placement:
    ranks: list[int]
    stage_ranks: list[list[int]]


def place_pipelines(pipeline_schemes: Sequence[ParallelScheme]) -> list[Placement]:
    """Contiguous rank blocks in the given order; inside a pipeline TP is innermost, then CP, then PP.

    With power-of-two grids sorted by `placement_key`, each TP (and TP*CP) group starts at a
    multiple of its size, so it stays inside a node whenever it is no larger than one.
    """
    placements = []
    base = 0
    for scheme in pipeline_schemes:
        grid = scheme.gpus_per_stage
        stages = [list(range(base + stage * grid, base + (stage + 1) * grid)) for stage in range(scheme.pp)]
        placements.append(Placement(ranks=[rank for stage in stages for rank in stage], stage_ranks=stages))
        base += scheme.num_gpus
    return placements


def count_vectors(combo: Sequence[ParallelScheme], num_gpus: int) -> Iterator[tuple[int, ...]]:
    """Every assignment of >= 1 pipeline per scheme that uses exactly `num_gpus` GPUs."""
    sizes = [scheme.num_gpus for scheme in combo]

    def extend(index: int, remaining: int) -> Iterator[tuple[int, ...]]:
        size = sizes[index]
        if index == len(sizes) - 1:
            if remaining >= size and remaining % size == 0:
                yield (remaining // size,)
            return
        rest_minimum = sum(sizes[index + 1 :])
        for count in range(1, (remaining - rest_minimum) // size + 1):
            for tail in extend(index + 1, remaining - count * size):
                yield (count, *tail)

    yield from extend(0, num_gpus)
