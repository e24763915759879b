"""Strategies (multisets of pipelines covering all GPUs) and their placement on ranks."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

from hydraplan.planner.limits import MAX_NUM_GPUS, MAX_STRATEGY_TERMS
from hydraplan.planner.scheme import ParallelScheme


@dataclass(frozen=True)
class Strategy:
    """How many pipelines of each scheme; canonical order: largest TP*CP grid, then size."""

    counts: tuple[tuple[ParallelScheme, int], ...]

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        # strategies key the search's sets and dicts (tens of thousands of lookups a plan): hashing
        # the nested tuple of frozen schemes afresh each time was ~8% of a default plan's time
        return hash(self.counts)

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


_TERM = re.compile(r"^\s*(\d{1,30})\s*[x*]\s*(<[^>]{0,40}>)\s*$")


def parse_strategy(text: str) -> Strategy:
    """Parse `1x<8,1,2> + 6x<4,2,1>` (a term `2x<4,2,1,2>` has v = 2 chunks per GPU); no term, count or
    degree beyond the planner's limits."""
    terms = text.split("+")
    if len(terms) > MAX_STRATEGY_TERMS:
        raise ValueError(f"strategy has {len(terms)} terms, more than the limit of {MAX_STRATEGY_TERMS}")
    counts = []
    for term in terms:
        match = _TERM.match(term)
        if not match:
            raise ValueError(
                f"strategy term {term.strip()[:60]!r} is not of the form COUNTx<tp,pp,cp> or COUNTx<tp,pp,cp,v>"
            )
        scheme, count = ParallelScheme.parse(match.group(2)), int(match.group(1))
        if count > MAX_NUM_GPUS or scheme.num_gpus > MAX_NUM_GPUS:
            raise ValueError(f"strategy term {term.strip()!r} uses more than the limit of {MAX_NUM_GPUS} GPUs")
        counts.append((scheme, count))
    return Strategy.of(counts)


def named_chunk_counts(texts: Sequence[str | None]) -> list[int]:
    """The chunk counts v > 1 the given strategy texts name, ascending (texts that do not parse are
    left to the planner, which says why): an analytic profile prices those interleaved schemes."""
    counts = set()
    for text in filter(None, texts):
        try:
            counts.update(scheme.v for scheme in parse_strategy(text).schemes)
        except ValueError:
            continue
    return sorted(counts - {1})


def check_strategy_fits(text: str, num_gpus: int, gpus_per_node: int, field: str) -> Strategy:
    """The strategy `text` names, if it can run on the cluster: exactly its GPUs, TP inside a node.

    Raises ValueError naming `field` otherwise; the work is linear in the text, never in the
    pipelines it describes.
    """
    try:
        strategy = parse_strategy(text)
    except ValueError as error:
        raise ValueError(f"{field}: {error}") from None
    if strategy.num_gpus != num_gpus:
        raise ValueError(f"{field} {strategy} uses {strategy.num_gpus} GPUs, the cluster has {num_gpus}")
    node = min(num_gpus, gpus_per_node)
    for scheme in strategy.schemes:
        if scheme.tp > node:
            raise ValueError(f"{field} {strategy}: scheme {scheme} has tp {scheme.tp} > {node} GPUs per node")
    return strategy


def unplaceable_reason(scheme: ParallelScheme, num_gpus: int, gpus_per_node: int) -> str | None:
    """Why `place_pipelines` could put this scheme's TP groups, or a TP x CP grid no larger than a
    node, across nodes of this cluster (the rule `planner.check` holds plans to); None when it
    cannot. A cluster of at most one node holds anything. Else blocks are laid out largest grid
    first, so a grid stays inside a node when it is a whole node, or a power of two dividing the
    node (every grid laid out before it is then a multiple of it), and a grid larger than a node
    keeps its TP groups inside nodes when it is a whole number of nodes and TP divides the node."""
    if num_gpus <= gpus_per_node:
        return None
    grid = scheme.gpus_per_stage
    if grid <= gpus_per_node:
        if grid == gpus_per_node or (grid & (grid - 1) == 0 and gpus_per_node % grid == 0):
            return None
        return f"its TP x CP grid of {grid} GPUs is not a power of two dividing the {gpus_per_node} GPUs of a node"
    if grid % gpus_per_node == 0 and gpus_per_node % scheme.tp == 0:
        return None
    return (
        f"its TP x CP grid of {grid} GPUs is not a whole number of {gpus_per_node}-GPU nodes with tp "
        f"{scheme.tp} dividing a node"
    )


def placement_key(scheme: ParallelScheme) -> tuple[int, int, int, int, int, int]:
    """Pipelines with larger TP*CP grids first, so every grid starts at a multiple of its size."""
    return (-scheme.gpus_per_stage, -scheme.num_gpus, -scheme.tp, scheme.pp, scheme.cp, scheme.v)


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
