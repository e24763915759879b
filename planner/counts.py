"""Pipeline counts of a scheme set on N GPUs: which sets can fill the cluster, and their count
vectors, enumerated only when there are few enough to bound them all.

`strategies.count_vectors` walks every prefix, dead ones included: at 4,096 GPUs finding that a
set of small schemes has more than a few thousand vectors cost ~50 ms per set. Here a table of
how many completions each remainder has (`completions`) counts them first and guides the
enumeration past dead prefixes; the vectors and their order are those of `count_vectors`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from hydraplan.planner.scheme import ParallelScheme

NEAR_IDEAL_PER_LARGE_SET = 12


@lru_cache(maxsize=4096)
def fillable(sizes: tuple[int, ...], num_gpus: int) -> bool:
    """Whether at least one pipeline of each size can use exactly `num_gpus` GPUs.

    Bit r of `reachable` says r more GPUs can be filled with pipelines of these sizes; shifting
    by size, 2 size, 4 size, ... adds every multiple of a size in a logarithmic number of steps."""
    sizes = tuple(int(size) for size in sizes)  # Python ints: the bit sets outgrow any fixed width
    remainder = int(num_gpus) - sum(sizes)
    if remainder < 0 or remainder % math.gcd(*sizes):
        return False
    mask = (1 << (remainder + 1)) - 1
    reachable = 1
    for size in sorted(set(sizes)):
        shift = size
        while shift <= remainder:
            reachable |= (reachable << shift) & mask
            shift *= 2
    return bool(reachable >> remainder & 1)


def completions(sizes: Sequence[int], num_gpus: int, cap: int) -> list[np.ndarray]:
    """`table[k][r]`: how many ways pipelines of sizes `sizes[k:]`, at least one of each, use
    exactly r GPUs, counted up to `cap + 1` (larger counts are clipped to it)."""
    width = num_gpus + 1
    last = np.zeros(width, dtype=np.int64)
    last[sizes[-1] :: sizes[-1]] = 1
    tables = [last]
    for size in reversed(sizes[:-1]):
        after = tables[0]
        # ways[r] = sum over n >= 1 of after[r - n size]: a running sum along each residue class
        padded = np.zeros(-(-width // size) * size + size, dtype=np.int64)
        padded[size : size + width] = after
        classes = padded.reshape(-1, size)
        ways = np.minimum(np.cumsum(classes, axis=0), cap + 1).reshape(-1)[:width]
        tables.insert(0, ways)
    return tables


def capped_count_vectors(combo: Sequence[ParallelScheme], num_gpus: int, most: int) -> list[tuple[int, ...]] | None:
    """`list(strategies.count_vectors(combo, num_gpus))` when it has at most `most` vectors,
    else None, in time linear in the GPUs plus the vectors listed."""
    sizes = [scheme.num_gpus for scheme in combo]
    table = completions(sizes, num_gpus, most)
    if table[0][num_gpus] > most:
        return None
    vectors: list[tuple[int, ...]] = []

    def extend(index: int, remaining: int, prefix: tuple[int, ...]) -> None:
        size = sizes[index]
        if index == len(sizes) - 1:
            vectors.append((*prefix, remaining // size))
        elif index == len(sizes) - 2:
            # count * size + rest * last = remaining: the counts that work form one residue class
            last = sizes[-1]
            step = last // math.gcd(size, last)
            first = (remaining // math.gcd(size, last)) * pow(size // (last // step), -1, step) % step or step
            for count in range(first, (remaining - last) // size + 1, step):
                vectors.append((*prefix, count, (remaining - count * size) // last))
        else:
            after = table[index + 1]
            for count in range(1, (remaining - sum(sizes[index + 1 :])) // size + 1):
                if after[remaining - count * size]:
                    extend(index + 1, remaining - count * size, (*prefix, count))

    if table[0][num_gpus]:
        extend(0, num_gpus, ())
    return vectors


def near_ideal(ideal: Sequence[float], combo: Sequence[ParallelScheme], num_gpus: int) -> list[tuple[int, ...]]:
    """Integer count vectors within two pipelines of the ideal on every scheme but the smallest."""
    sizes = [scheme.num_gpus for scheme in combo]
    filler = int(np.argmin(sizes))
    ranges = []
    for index, want in enumerate(ideal):
        base = int(math.floor(want))
        ranges.append([0] if index == filler else sorted({max(1, base + delta) for delta in (-1, 0, 1, 2)}))
    vectors = []
    for choice in itertools.product(*ranges):
        rest = num_gpus - sum(count * size for index, (count, size) in enumerate(zip(choice, sizes)) if index != filler)
        if rest >= sizes[filler] and rest % sizes[filler] == 0:
            vectors.append(
                tuple(rest // sizes[filler] if index == filler else count for index, count in enumerate(choice))
            )
    return sorted(vectors, key=lambda counts: sum(abs(c - w) * s for c, w, s in zip(counts, ideal, sizes)))[
        :NEAR_IDEAL_PER_LARGE_SET
    ]
