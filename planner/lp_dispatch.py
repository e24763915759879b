"""Dispatch by LP relaxation (HiGHS) + rounding, on the scheme-type level.

Pipelines of one scheme are interchangeable, so the LP decides how many items of each length go
to each scheme type: variables `y[l, s] >= 0` (items of length l on type s, only where l fits s's
capacity) and the makespan `T`:

    minimise T
    subject to  sum_s y[l, s] = count(l)                                   every length l
                rho_s * sum_l w_s(l) y[l, s] + n_s * K_s <= n_s * T          every type s

`w_s(l)` is the stage work of an item, `rho_s >= 1` the packing/bubble inflation of type s measured
on an incumbent (1 without one) and `K_s` the bubble floor. Rounding keeps each length's integral
part per type and deals the fractional remainders by largest remainder; within a type the items are
spread over its pipelines by the greedy estimate. HiGHS runs single-threaded by default; its
`threads` option is process-global, so we leave it alone.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence

import numpy as np

from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.dispatch import greedy_dispatch

_SOLVERS = threading.local()  # one HiGHS instance per thread, reused: creating one costs ~5 ms


def _new_highs():
    """This thread's silent HiGHS instance, cleared. The first construction in a process prints a
    banner to stdout (before any option can be set), which would corrupt JSON output: swallow it."""
    import highspy

    highs = getattr(_SOLVERS, "highs", None)
    if highs is None:
        with _stdout_to_devnull():
            highs = highspy.Highs()
        highs.setOptionValue("output_flag", False)
        _SOLVERS.highs = highs
    else:
        highs.clearModel()
    return highs


@contextlib.contextmanager
def _stdout_to_devnull():
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    with open(os.devnull, "w") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def solve_type_lp(
    lengths: np.ndarray, types: Sequence[SchemeCoefficients], counts: Sequence[int], inflation: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """Solve the LP; returns (unique lengths, y[len(unique), len(types)], T) or None on failure."""
    import highspy

    unique, multiplicity = np.unique(lengths, return_counts=True)
    as_float = unique.astype(np.float64)
    num_lengths, num_types = len(unique), len(types)
    # one column per (length, type) that fits, type by type, lengths ascending; then T. Built as
    # arrays: the same matrix, entry for entry, as a loop over the columns (~25 ms at 7,500 columns)
    rows_of = [np.flatnonzero(unique <= coef.capacity_tokens) for coef in types]
    rows = np.concatenate([np.zeros(0, dtype=np.int64), *rows_of])
    kinds = np.repeat(np.arange(num_types), [len(part) for part in rows_of])
    work = np.concatenate(
        [np.zeros(0)]
        + [
            factor * (coef.a * as_float[part] ** 2 + coef.b * as_float[part])
            for coef, factor, part in zip(types, inflation, rows_of)
        ]
    )
    num_columns = len(rows) + 1  # last column is T
    indices = np.concatenate([np.column_stack((rows, num_lengths + kinds)).ravel(), num_lengths + np.arange(num_types)])
    values = np.concatenate([np.column_stack((np.ones(len(rows)), work)).ravel(), [-float(count) for count in counts]])
    starts = np.r_[np.arange(0, 2 * len(rows) + 1, 2), 2 * len(rows) + num_types]
    floors = [count * (coef.scheme.pp - 1) * coef.c for coef, count in zip(types, counts)]

    model = highspy.HighsLp()
    model.num_col_ = num_columns
    model.num_row_ = num_lengths + num_types
    model.col_cost_ = np.r_[np.zeros(num_columns - 1), 1.0]
    model.col_lower_ = np.zeros(num_columns)
    model.col_upper_ = np.full(num_columns, highspy.kHighsInf)
    model.row_lower_ = np.r_[multiplicity.astype(np.float64), np.full(num_types, -highspy.kHighsInf)]
    model.row_upper_ = np.r_[multiplicity.astype(np.float64), -np.asarray(floors, dtype=np.float64)]
    model.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    model.a_matrix_.start_ = starts.astype(np.int32)
    model.a_matrix_.index_ = indices.astype(np.int32)
    model.a_matrix_.value_ = values.astype(np.float64)
    highs = _new_highs()
    highs.passModel(model)
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    solution = np.asarray(highs.getSolution().col_value)
    shares = np.zeros((num_lengths, num_types))
    shares[rows, kinds] = np.where(solution[:-1] > 0.0, solution[:-1], 0.0)  # max(0.0, value)
    return unique, shares, float(solution[-1])


def round_shares(lengths: np.ndarray, unique: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Type of every item: each length's items split by its LP shares, largest remainder first.
    Items of one length are interchangeable, so which of them goes where does not matter.

    All lengths at once, the same arithmetic per length as one at a time (~20 ms of Python at
    2,500 lengths): shares scaled to the length's item count, floors, then one more for the
    largest remainders (stable order: the first type wins a tie)."""
    by_length = np.argsort(lengths, kind="stable")
    bounds = np.r_[np.searchsorted(lengths[by_length], unique, side="left"), len(lengths)]
    sizes = np.diff(bounds)
    num_types = shares.shape[1]
    want = shares * (sizes / np.maximum(shares.sum(axis=1), 1e-12))[:, None]
    whole = np.floor(want + 1e-9).astype(np.int64)
    remainder = sizes - whole.sum(axis=1)
    # the types ranked by remainder, largest first; a type gets one more if its rank is below the
    # count missing (as a slice `[:remainder]` would take them, a negative count included)
    order = np.argsort(-(want - whole), axis=1, kind="stable")
    rank = np.empty_like(order)
    rank[np.arange(len(order))[:, None], order] = np.arange(num_types)[None, :]
    taken = np.where(remainder < 0, np.maximum(num_types + remainder, 0), np.minimum(remainder, num_types))
    whole += rank < taken[:, None]
    item_type = np.empty(len(lengths), dtype=np.int64)
    item_type[by_length] = np.repeat(np.tile(np.arange(num_types), len(unique)), whole.ravel())
    return item_type


def lp_dispatch(
    lengths: np.ndarray, coefs: Sequence[SchemeCoefficients], inflation: dict[SchemeCoefficients, float] | None = None
) -> list[np.ndarray] | None:
    """Item indices per pipeline (pipelines in `coefs` order), or None when the LP or a type's
    greedy split fails (e.g. a type gets fewer items than it has pipelines)."""
    types = list(dict.fromkeys(coefs))
    counts = [sum(1 for coef in coefs if coef == kind) for kind in types]
    factors = [max(1.0, (inflation or {}).get(kind, 1.0)) for kind in types]
    solved = solve_type_lp(lengths, types, counts, factors)
    if solved is None:
        return None
    unique, shares, _ = solved
    item_type = round_shares(lengths, unique, shares)
    assignment: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(coefs)
    for kind, coef in enumerate(types):
        members = np.flatnonzero(item_type == kind)
        pipelines = [index for index, other in enumerate(coefs) if other == coef]
        if len(members) < len(pipelines) or (len(members) and lengths[members].max() > coef.capacity_tokens):
            return None
        split = greedy_dispatch(lengths[members], [coef] * len(pipelines))
        if split is None:
            return None
        for pipeline, local in zip(pipelines, split):
            assignment[pipeline] = members[local]
    return assignment
