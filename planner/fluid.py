"""Fluid estimates of a strategy's slowest pipeline: the search's solve order, not a bound.

For a strategy with `n_s` pipelines of scheme s, the fluid relaxation lets items be split between
pipelines of a scheme and between schemes: the least T such that the items can be divided with
`load_s <= n_s (T - K_s)` (`K_s` the 1F1B floor `(pp_s - 1) c_s`). The dual of that LP is what
`BoundTables.count_bounds` evaluates on a grid of multipliers, which is weak where a set's cheap
pipelines are scarce: for `11x<4,1,1> + 2x<2,1,2> + 12x<1,1,1>` (8B, 64 H100, an SFT-mix batch)
the grid gave 1.513 s, the LP 1.743 s, and greedy dispatch and packing 1.842 s.

Here the items are divided by length: an item's cost on scheme s per token is `a_s l + b_s +
c_s / cap_s`, a line in l, so under the LP's optimal multipliers each scheme takes the lengths
where its (scaled) line is lowest, an interval when every scheme fits every length. For every
order of the set's schemes along the lengths (at most 3! = 6) the least T whose greedy fill (the
shortest items to the first scheme up to its capacity, the next ones to the second, ...) holds
every item is found on two grids of times; the estimate is the least over the orders. That is a
fractional plan, so never below the LP's value, and equal to it when the LP's optimum is such an
interval assignment (a scheme whose capacity ends inside another's interval can break that; the
estimate is then above the LP, closer to what plans achieve). Items that fit no order give inf.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from hydraplan.planner.bounds import BoundTables

# times tried at once per row: a geometric grid over (lower, 2 lower], then a linear one over the
# step that holds first: within ~0.3% of the greedy's least T in two passes (solve order only)
GRID_POINTS = 16
MAX_DOUBLINGS = 40
MISFIT = 1e200  # the load of an item on a scheme it does not fit (see `interval_fluid_s`)


def interval_fluid_s(
    tables: BoundTables,
    columns: Sequence[int],
    counts: np.ndarray,
    inflation: np.ndarray | None,
    lower_s: np.ndarray,
) -> np.ndarray:
    """Per row of `counts` (pipelines per scheme of `columns`): the least pipeline time T of a
    fractional division of the items by length intervals (see the module docstring). `inflation`
    (per column, >= 1, or None) multiplies each scheme's item costs (an estimate, not a bound,
    then); `lower_s` (per row, the fluid dual of `count_bounds` or any value known not to exceed
    the result) starts the search. Inf where some item fits no scheme of `columns`."""
    per_pipeline, floors = tables.fluid_costs(columns)
    if inflation is not None:
        per_pipeline = per_pipeline * inflation[None, :]
    if not np.isfinite(per_pipeline).any(axis=1).all():
        return np.full(len(counts), np.inf)  # some item fits no scheme of the set
    loads = tables.multiplicity[:, None] * per_pipeline  # lengths x schemes, inf where a length misfits
    # cumulative load over the items in length order, at whole positions 0..R; misfits are the longest
    # lengths of a scheme (a suffix), priced MISFIT each and increasingly: a fill stops before them,
    # and what is left beside one cannot fit a room
    fits = np.isfinite(loads)
    finite = np.cumsum(np.where(fits, loads, 0.0), axis=0)
    beyond = np.cumsum(~fits, axis=0) * MISFIT
    prefix = np.vstack([np.zeros(per_pipeline.shape[1]), finite + beyond])
    return _least_time(prefix, floors, counts.astype(np.float64), np.asarray(lower_s, dtype=np.float64))


def _least_time(prefix: np.ndarray, floors: np.ndarray, counts: np.ndarray, lower_s: np.ndarray) -> np.ndarray:
    schemes = prefix.shape[1]
    orders = list(itertools.permutations(range(schemes)))
    positions = np.arange(prefix.shape[0], dtype=np.float64)
    columns = [np.ascontiguousarray(prefix[:, scheme]) for scheme in range(schemes)]

    def advance(scheme: int, position: np.ndarray, room: np.ndarray) -> np.ndarray:
        """The furthest fractional position reached from `position` adding at most `room` of load."""
        column = columns[scheme]
        return np.maximum(position, np.interp(np.interp(position, positions, column) + room, column, positions))

    def holds(row_counts: np.ndarray, time_s: np.ndarray) -> np.ndarray:
        """Per entry (pipeline counts, time): whether the greedy fill holds every item in some order."""
        result = np.zeros(len(time_s), dtype=bool)
        room = row_counts * np.maximum(time_s[:, None] - floors[None, :], 0.0)  # entries x schemes
        start = np.zeros(len(time_s))
        firsts = {scheme: advance(scheme, start, room[:, scheme]) for scheme in range(schemes)}
        for order in orders:
            position = firsts[order[0]] if len(order) > 1 else start  # items done so far, fractional
            for scheme in order[1:-1]:
                position = advance(scheme, position, room[:, scheme])
            last = columns[order[-1]]
            rest = last[-1] - np.interp(position, positions, last)
            result |= rest <= room[:, order[-1]] * (1 + 1e-12)
        return result

    def first_holding(row_counts: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """Per row, the index of the first time of its row of `grid` that holds (len if none):
        holding is monotone in the time, so the first is where the least time lies."""
        ok = holds(np.repeat(row_counts, grid.shape[1], axis=0), grid.reshape(-1)).reshape(grid.shape)
        return np.where(ok.any(axis=1), ok.argmax(axis=1), grid.shape[1])

    low = np.maximum(lower_s, 1e-9)
    result = np.full(len(counts), np.inf)
    pending = np.arange(len(counts))
    steps = np.arange(1, GRID_POINTS + 1) / GRID_POINTS
    for _ in range(MAX_DOUBLINGS):
        if not pending.size:
            break
        base = low[pending]
        grid = base[:, None] * 2.0 ** steps[None, :]  # (low, 2 low]
        first = first_holding(counts[pending], grid)
        found = first < GRID_POINTS
        hit, index = pending[found], first[found]
        upper = grid[found, index]
        lower = np.where(index > 0, grid[found, np.maximum(index - 1, 0)], base[found])
        fine = lower[:, None] + (upper - lower)[:, None] * steps[None, :]  # (lower, upper]
        result[hit] = fine[np.arange(len(hit)), np.minimum(first_holding(counts[hit], fine), GRID_POINTS - 1)]
        low[pending[~found]] *= 2.0
        pending = pending[~found]
    return result
