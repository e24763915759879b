"""Certified floors on the 1F1B bubble, and the pipeline-time bound they give.

For a pipeline of `pp` stages running `m` micro-batches with stage times `t_1..t_m` (forward share
`f` of each on every stage), let `T(t)` be the exact 1F1B makespan (`planner.simulate`): the longest
path through the schedule's dependency graph. Two floors, with `S = sum(t)`:

1. **Largest micro-batch** (proved here). For any k, this chain is a path of the graph: the forward
   of micro-batch 1 on stages 0..pp-2, every operation of the last stage up to the backward of k
   (1F1B runs F1 B1 F2 B2 ... there), the backward of k on stages pp-2..0, then every operation of
   stage 0 after it (the forwards of k+pp.. and backwards of k+1..). Its length is
   `S + (pp-1) f t_1 + (pp-1)(1-f) t_k - f * sum(t_{k+1..k+pp-1})`; with k the largest micro-batch,

       T >= S + (pp-1) (1-2f) t_max >= (1 + kappa (pp-1) / m) S,     kappa = max(0, 1-2f).

2. **Least bubble** (computed). `T` is a maximum of linear functions of `t`, so convex and
   positively homogeneous, and `T(t) >= (1 + rho_m) S` with
   `rho_m = min { T(u) - 1 : u >= 0, sum(u) = 1 }`, the optimum of a linear programme (operation end
   times and micro-batch shares as variables, one constraint per dependency). It is tabulated for
   `m <= M` (`data/bubble_floors.json`, rounded down so HiGHS's tolerances cannot make it invalid);
   `python -m hydraplan.planner.bubble_floor` re-solves it. Uneven sizes (ramping up over ~pp micro-batches,
   tapering off at the end) beat equal ones by about a third; the packer (`planner.packing`) uses
   the LP's optimal shares as targets.

A pipeline whose items carry stage work `W` (seconds, without the per-micro-batch overhead `c`)
over `m` micro-batches has `S = W + m c`, so with `r_m` the larger of the two floors

    T >= g(W) = min over m >= 1 of (1 + r_m)(W + m c).

For m > M we group counts into ranges [m_a, m_b) priced `(1 + r_{m_b - 1})(W + m_a c)`, and every
m beyond the last range by `W + (m_last + pp - 1) c`. `g` is then a minimum of finitely many
increasing linear functions of `W`: concave and increasing, with inverse
`G(T) = max_j (T - beta_j) / alpha_j`. It prices what `(pp-1) c` alone misses: a pipeline must
trade micro-batch overheads against bubbles, at a cost of about `2 sqrt(kappa' (pp-1) W c)`.
A pipeline that holds only k items runs at most k micro-batches: `g` over m <= k (ranges cut at
k, no unbounded tail) is larger, still concave and increasing, and its inverse is found the same way.

**Interleaved 1F1B** (`v > 1` chunks per rank, `planner.simulate.simulate_interleaved_1f1b`). A
rank runs v chunks of every micro-batch, each taking `f t_i / v` forward and `(1-f) t_i / v`
backward, so every rank is busy `S = W + m c` in all (a, b, c price a rank's v chunks). hydraplan
runs interleaved pipelines with Megatron-Core's groups of pp (`simulate.interleaved_count_ok`; the
checker refuses other counts): m is a positive multiple of pp. Two floors:

3. **Fill and drain** (proved here), valid for any order of the operations on each rank. Let rank
   pp-1 first run the forward of some micro-batch k' on virtual stage `j pp + pp - 1`: that forward
   waits for the forwards of k' on the virtual stages before it, among them stages 0..pp-2, so rank
   pp-1 starts no earlier than `(pp-1) f t_k' / v`. It then runs its S of work one operation after
   another. Its last operation is a backward (every forward on a rank precedes its own backward
   there), of some micro-batch k on a virtual stage `j pp + pp - 1 >= pp - 1`: the backwards of k on
   the pp-1 virtual stages below it (on ranks pp-2..0) follow it one after another. So

       T >= S + (pp-1) (f t_k' + (1-f) t_k) / v >= W + m c + (pp-1) c / v,

   every micro-batch taking at least c: `W + (pp + (pp-1)/v) c` at least (`interleaved_overhead_s`),
   and the fluid floor per pipeline is `(pp-1) c / v` (`fill_drain_floor_s`: the bubble of 1F1B,
   `(pp-1) c`, shrunk v times).

4. **Least bubble** (computed), as item 2 for Megatron-Core's interleaved order: its makespan `T(t)`
   is again the longest path through a fixed dependency graph (`simulate.interleaved_dependency_order`:
   each operation after the one before it on its rank and the one it waits for), a maximum of
   linear functions of t, so convex and positively homogeneous, and `T(t) >= (1 + rho_m) S` with
   `rho_m = min { T(u) - 1 : u >= 0, sum(u) = 1 }` over m micro-batches (micro-batch i taking
   `f u_i / v` and `(1-f) u_i / v` on each chunk; `solve_interleaved_floor_lp`, the makespan a
   variable at least every rank's last end). It is tabulated for m = pp, 2 pp, ... <= M and the
   (pp, v) of `TABULATED_INTERLEAVED` (`data/interleaved_bubble_floors.json`, rounded down like
   the 1F1B table). At m = pp it equals the fill-and-drain floor's `(pp-1) / (pp v)` in every
   tabulated pair (one group, equal sizes); with more groups uneven sizes pay, as for 1F1B. The
   pieces of an interleaved pipeline are then `(1 + rho_m)(W + m c)` for tabulated m (up to a cap
   on the count), one
   `W + (m' + (pp-1)/v) c` for every count from m', the first multiple of pp past the table, and
   g is taken no lower than floor 3's `W + (pp + (pp-1)/v) c` (`pipeline_time_floor_s`,
   `most_work_s`: the max keeps g increasing, `g(W) - W` non-decreasing and `g(W)/W`
   non-increasing, all the bounds rely on). A cap below pp (no such pipeline) or an untabulated
   (pp, v, f) keeps floor 3 alone. The largest-micro-batch path (item 1) is 1F1B's and is not
   used for v > 1 (`largest_micro_batch_floor_s` gives floor 3, whatever the item); the
   longest-item bound `T >= pp (w + c)` holds as it is (the item's micro-batch crosses all `pp v`
   chunks, `t / v` each).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources

import numpy as np

from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.simulate import dependency_order, interleaved_dependency_order

TABLE_SCHEMA = "hydraplan.bubble-floors/1"
TABLE_FILE = "bubble_floors.json"
MAX_MICRO_BATCHES = 64  # M: floors are tabulated for m = 1..M
MAX_PRICED_MICRO_BATCHES = 1 << 16  # counts beyond are priced by their overheads alone
# a cap on the micro-batch count (a pipeline holds at most so many items) above this changes the
# floor by well under 1% and is dropped: it keeps the memo of pieces small
MAX_CAPPED_MICRO_BATCHES = 128
TAIL_RANGE_RATIO = 1.25  # counts above M are priced in ranges this wide
SAFETY = 1e-6  # subtracted from every LP optimum before tabulating (HiGHS tolerances are ~1e-7)
# the table covers these stage counts (every pp the bundled models' layer counts allow: up to 80, and
# Llama 3 405B's divisors of 126)
# at the profiles' forward share
TABULATED_STAGE_COUNTS = (2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 15, 16, 18, 20, 21, 30, 32, 40, 42, 60, 63, 80, 126)
TABULATED_FWD_FRACTION = 1 / 3
INTERLEAVED_TABLE_SCHEMA = "hydraplan.interleaved-bubble-floors/1"
INTERLEAVED_TABLE_FILE = "interleaved_bubble_floors.json"
# (pp, v) of interleaved 1F1B the table covers: the pairs `planner.baselines.recipe_chunks` gives over
# the catalog models' depths (tests/test_interleaved_floor.py checks they are all here) and the
# exhaustive suite's v = 2 at pp 2 and 3; m = pp, 2 pp, ... up to MAX_MICRO_BATCHES
TABULATED_INTERLEAVED = (
    (2, 2), (2, 4), (2, 5), (2, 6), (2, 9), (2, 10), (3, 2), (3, 5), (3, 6), (4, 2), (4, 3), (4, 5),
    (5, 2), (5, 3), (5, 4), (6, 2), (6, 3), (7, 3), (8, 2), (9, 2), (10, 2),
)  # fmt: skip


def solve_floor_lp(num_stages: int, num_micro_batches: int, fwd_fraction: float) -> tuple[float, np.ndarray]:
    """rho_m, the least relative bubble of any 1F1B run of m micro-batches (see module docstring),
    and micro-batch shares (summing to 1, in execution order) that attain it."""
    order = dependency_order(num_stages, num_micro_batches)
    # the end of the backward of the last micro-batch on stage 0 is the makespan
    last = num_stages * num_micro_batches + num_micro_batches - 1
    value, shares = _solve_order_lp(order, num_micro_batches, fwd_fraction, 1.0, [last])
    if value is None:
        raise RuntimeError(f"bubble LP pp={num_stages} m={num_micro_batches} f={fwd_fraction}: not solved")
    return value, shares


def solve_interleaved_floor_lp(
    num_stages: int, num_chunks: int, num_micro_batches: int, fwd_fraction: float
) -> tuple[float, np.ndarray]:
    """rho_m of Megatron-Core's interleaved 1F1B (groups of pp, `simulate.interleaved_dependency_order`)
    with `num_chunks` chunks per rank: the least `T(u) - 1` over shares u >= 0 summing to 1, micro-batch
    i taking `f u_i / v` forward and `(1-f) u_i / v` backward on each chunk (module docstring, item 4),
    and shares attaining it."""
    order = interleaved_dependency_order(num_stages, num_chunks, num_micro_batches, num_stages)
    # the last operation of each rank (no operation follows it there) ends the makespan at the latest
    following = set(order[:, 1].tolist())
    lasts = [op for op in order[:, 0].tolist() if op not in following]
    value, shares = _solve_order_lp(order, num_micro_batches, fwd_fraction, 1.0 / num_chunks, lasts)
    if value is None:
        raise RuntimeError(
            f"interleaved bubble LP pp={num_stages} v={num_chunks} m={num_micro_batches} f={fwd_fraction}: not solved"
        )
    return value, shares


def _solve_order_lp(
    order: np.ndarray, num_micro_batches: int, fwd_fraction: float, scale: float, lasts: list[int]
) -> tuple[float | None, np.ndarray]:
    """min T - 1 over shares u >= 0 (sum 1) and operation ends: each operation of `order` (rows
    op, previous, waits for, slot) ends at least `scale * f u_i` (slot i < m) or `scale * (1-f) u_i`
    (slot m + i) after both its predecessors, and T is at least the end of each op of `lasts`.
    (None, shares) when HiGHS does not reach an optimum."""
    import highspy

    from hydraplan.planner.lp_dispatch import _new_highs

    num_ops = len(order)
    sentinel = num_ops  # the op that ended at time 0: not a variable
    rows, cols, vals = [], [], []
    row = 0
    for op, previous, waits_for, slot in order.tolist():
        share = scale * (fwd_fraction if slot < num_micro_batches else 1.0 - fwd_fraction)
        micro_batch = slot % num_micro_batches
        for predecessor in {previous, waits_for}:
            # end[op] - end[predecessor] - share * u[micro_batch] >= 0
            rows += [row, row]
            cols += [op, num_ops + micro_batch]
            vals += [1.0, -share]
            if predecessor != sentinel:
                rows.append(row)
                cols.append(predecessor)
                vals.append(-1.0)
            row += 1
    makespan = num_ops + num_micro_batches  # T (a variable only when several ops may end last)
    if len(lasts) > 1:
        for op in lasts:  # T - end[op] >= 0
            rows += [row, row]
            cols += [makespan, op]
            vals += [1.0, -1.0]
            row += 1
    else:
        makespan = lasts[0]
    num_vars = num_ops + num_micro_batches + (len(lasts) > 1)
    rows.extend([row] * num_micro_batches)  # sum(u) = 1
    cols.extend(range(num_ops, num_ops + num_micro_batches))
    vals.extend([1.0] * num_micro_batches)
    num_rows = row + 1
    matrix = _csc(rows, cols, vals, num_vars)
    model = highspy.HighsLp()
    model.num_col_, model.num_row_ = num_vars, num_rows
    cost = np.zeros(num_vars)
    cost[makespan] = 1.0
    model.col_cost_ = cost
    model.col_lower_ = np.zeros(num_vars)
    model.col_upper_ = np.full(num_vars, highspy.kHighsInf)
    model.row_lower_ = np.r_[np.zeros(num_rows - 1), 1.0]
    model.row_upper_ = np.r_[np.full(num_rows - 1, highspy.kHighsInf), 1.0]
    model.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    model.a_matrix_.start_, model.a_matrix_.index_, model.a_matrix_.value_ = matrix
    highs = _new_highs()
    highs.passModel(model)
    highs.run()
    shares = np.maximum(np.asarray(highs.getSolution().col_value)[num_ops : num_ops + num_micro_batches], 0.0)
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None, shares
    return float(highs.getInfo().objective_function_value) - 1.0, shares / shares.sum()


def _csc(rows: list[int], cols: list[int], vals: list[float], num_cols: int):
    order = np.lexsort((rows, cols))
    col_array = np.asarray(cols)[order]
    starts = np.searchsorted(col_array, np.arange(num_cols + 1)).astype(np.int32)
    return starts, np.asarray(rows, dtype=np.int32)[order], np.asarray(vals, dtype=np.float64)[order]


@dataclass(frozen=True)
class _Entry:
    floors: tuple[float, ...]  # rho_1..rho_M
    shapes: tuple[np.ndarray, ...]  # shapes[m-1]: shares of S per micro-batch attaining rho_m


@cache
def _table() -> dict[tuple[int, float], _Entry]:
    return parse_table(resources.files("hydraplan.planner").joinpath("data", TABLE_FILE).read_text())


def parse_table(text: str) -> dict[tuple[int, float], _Entry]:
    """The table file's entries by (pp, forward share); a file of another schema is refused."""
    data = json.loads(text)
    if data.get("schema") != TABLE_SCHEMA:
        raise ValueError(f"{TABLE_FILE}: schema {data.get('schema')!r}, expected {TABLE_SCHEMA!r}")
    return {
        (int(entry["pp"]), round(float(entry["fwd_fraction"]), 9)): _Entry(
            tuple(float(v) for v in entry["floors"]), tuple(np.asarray(shape) for shape in entry["shapes"])
        )
        for entry in data["entries"]
    }


def tabulated_floors(num_stages: int, fwd_fraction: float) -> tuple[float, ...] | None:
    """rho_1..rho_M for this stage count and forward share, or None if not tabulated."""
    entry = _table().get((num_stages, round(fwd_fraction, 9)))
    return entry.floors if entry else None


def ramp_shape(num_stages: int, fwd_fraction: float, num_micro_batches: int) -> np.ndarray | None:
    """Stage-time shares (execution order, summing to ~1) of m micro-batches that attain the
    least bubble, or None if not tabulated. Sizes ramp up over about pp micro-batches and taper
    off at the end: with forward shorter than backward, equal sizes are not the best."""
    entry = _table().get((num_stages, round(fwd_fraction, 9)))
    if entry is None or not 1 <= num_micro_batches <= len(entry.shapes):
        return None
    return entry.shapes[num_micro_batches - 1]


@cache
def peak_shares(num_stages: int, fwd_fraction: float) -> np.ndarray | None:
    """The largest share of each least-bubble shape (index m-1 for m micro-batches), or None if
    not tabulated."""
    entry = _table().get((num_stages, round(fwd_fraction, 9)))
    return None if entry is None else np.array([float(shape.max()) for shape in entry.shapes])


@cache
def _interleaved_table() -> dict[tuple[int, int, float], dict[int, float]]:
    return parse_interleaved_table(
        resources.files("hydraplan.planner").joinpath("data", INTERLEAVED_TABLE_FILE).read_text()
    )


def parse_interleaved_table(text: str) -> dict[tuple[int, int, float], dict[int, float]]:
    """The interleaved table's floors by (pp, v, forward share): micro-batch count -> rho_m; a
    file of another schema is refused."""
    data = json.loads(text)
    if data.get("schema") != INTERLEAVED_TABLE_SCHEMA:
        raise ValueError(
            f"{INTERLEAVED_TABLE_FILE}: schema {data.get('schema')!r}, expected {INTERLEAVED_TABLE_SCHEMA!r}"
        )
    return {
        (int(entry["pp"]), int(entry["v"]), round(float(entry["fwd_fraction"]), 9)): {
            int(count): float(value) for count, value in zip(entry["counts"], entry["floors"])
        }
        for entry in data["entries"]
    }


def tabulated_interleaved_floors(num_stages: int, num_chunks: int, fwd_fraction: float) -> dict[int, float] | None:
    """rho_m of interleaved 1F1B by micro-batch count m (pp, 2 pp, ... up to MAX_MICRO_BATCHES) for
    this (pp, v) and forward share, or None if not tabulated."""
    return _interleaved_table().get((num_stages, num_chunks, round(fwd_fraction, 9)))


def bubble_stages(coef: SchemeCoefficients) -> int:
    """The stage count whose 1F1B bubble the tabulated and largest-micro-batch floors price: pp, or
    1 (neither applies) for an interleaved scheme, which has its own floors (`_interleaved_pieces`)."""
    return coef.scheme.pp if coef.scheme.v == 1 else 1


def fill_drain_floor_s(coef: SchemeCoefficients) -> float:
    """K: a pipeline of this scheme takes at least its micro-batches' stage times plus this,
    `(pp-1) c` for 1F1B and `(pp-1) c / v` for the interleaved schedule (floor 3 of the module
    docstring; 1F1B's is its v = 1 case)."""
    return (coef.scheme.pp - 1) * coef.c / coef.scheme.v


def interleaved_overhead_s(coef: SchemeCoefficients) -> float:
    """`T - W` at least for an interleaved pipeline (v > 1): at least pp micro-batches (a multiple
    of pp) of overhead c each, plus the fill-and-drain floor (module docstring, item 3)."""
    return coef.scheme.pp * coef.c + fill_drain_floor_s(coef)


def _path_kappa(coef: SchemeCoefficients) -> float:
    """`(pp-1) max(0, 1-2f)`: the largest micro-batch's share of the path bound's bubble."""
    return (bubble_stages(coef) - 1) * max(0.0, 1.0 - 2.0 * coef.fwd_fraction)


def largest_micro_batch_floor_s(coef: SchemeCoefficients, item_work_s: float | np.ndarray) -> float | np.ndarray:
    """`T - W` at least, for a pipeline of this scheme whose items carry work W and include one
    of work `item_work_s`: the path bound with `S >= W + c`, `t_1 >= c`, `t_max >= c + item`
    (interleaved: `interleaved_overhead_s`, whatever the item)."""
    if coef.scheme.v > 1:
        overhead_s = interleaved_overhead_s(coef)
        return overhead_s if np.ndim(item_work_s) == 0 else np.full(np.shape(item_work_s), overhead_s)
    return coef.c + _path_kappa(coef) * (coef.c + item_work_s) + (bubble_stages(coef) - 1) * coef.fwd_fraction * coef.c


def pipeline_pieces(coef: SchemeCoefficients, max_micro_batches: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, beta) with `T >= min_j alpha_j W + beta_j` for a pipeline of this scheme whose
    items carry work `W` (see module docstring), over at most `max_micro_batches` micro-batches
    when given (a pipeline holding k items runs at most k; caps above MAX_CAPPED_MICRO_BATCHES
    are ignored)."""
    if max_micro_batches is not None and max_micro_batches > MAX_CAPPED_MICRO_BATCHES:
        max_micro_batches = None
    return _pieces(coef, max_micro_batches)


@lru_cache(maxsize=4096)
def _pieces(coef: SchemeCoefficients, max_micro_batches: int | None) -> tuple[np.ndarray, np.ndarray]:
    stages, c = bubble_stages(coef), coef.c
    capped = max_micro_batches is not None
    most = max(1, max_micro_batches) if capped else MAX_PRICED_MICRO_BATCHES
    if coef.scheme.v > 1:
        return _interleaved_pieces(coef, most, capped)
    if stages == 1:
        return np.array([1.0]), np.array([c])  # one micro-batch at least, no bubble
    kappa = _path_kappa(coef)
    floors = tabulated_floors(stages, coef.fwd_fraction) or ()
    # counts up to M are priced one by one (by the path floor alone where no table exists)
    counts = np.arange(1, min(MAX_MICRO_BATCHES, most) + 1, dtype=np.float64)
    relative = kappa / counts
    tabulated = min(len(floors), len(counts))
    relative[:tabulated] = np.maximum(relative[:tabulated], floors[:tabulated])
    alpha = list(1.0 + relative)
    beta = list((1.0 + relative) * counts * c)
    first = len(counts) + 1
    while first <= most:
        last = min(most, max(first, math.floor(first * TAIL_RANGE_RATIO)))  # range [first, last]
        factor = 1.0 + kappa / last
        alpha.append(factor)
        beta.append(factor * first * c)
        first = last + 1
    if not capped:
        alpha.append(1.0)
        beta.append((first + stages - 1) * c)  # every m >= first: S >= W + m c, bubble >= (pp-1) c
    return np.asarray(alpha), np.asarray(beta)


def _interleaved_pieces(coef: SchemeCoefficients, most: int, capped: bool) -> tuple[np.ndarray, np.ndarray]:
    """Pieces of an interleaved pipeline (module docstring, item 4): `(1 + rho_m)(W + m c)` for each
    tabulated count m (a multiple of pp) up to `most`, and `W + m' c + (pp-1) c / v` for every count
    from m', the first multiple of pp past the table (when within `most`). Untabulated, or no
    multiple of pp within the cap (no such pipeline exists): the fill-and-drain piece alone."""
    pp, c = coef.scheme.pp, coef.c
    floors = tabulated_interleaved_floors(pp, coef.scheme.v, coef.fwd_fraction)
    if floors is None or most < pp:
        return np.array([1.0]), np.array([interleaved_overhead_s(coef)])
    counts = [count for count in sorted(floors) if count <= most]
    alpha = [1.0 + floors[count] for count in counts]
    beta = [(1.0 + floors[count]) * count * c for count in counts]
    following = (max(floors) // pp + 1) * pp  # the first count past the table
    if not capped or following <= most:
        alpha.append(1.0)
        beta.append(following * c + fill_drain_floor_s(coef))
    return np.asarray(alpha), np.asarray(beta)


def pipeline_time_floor_s(
    coef: SchemeCoefficients, work_s: np.ndarray | float, max_micro_batches: int | None = None
) -> np.ndarray:
    """g(W): least time of a pipeline of this scheme whose items carry work `W` (over at most
    `max_micro_batches` micro-batches when given)."""
    alpha, beta = pipeline_pieces(coef, max_micro_batches)
    work = np.asarray(work_s, dtype=np.float64)
    least = np.min(alpha * work[..., None] + beta, axis=-1)
    return np.maximum(least, work + interleaved_overhead_s(coef)) if coef.scheme.v > 1 else least


def most_work_s(
    coef: SchemeCoefficients, time_s: np.ndarray | float, max_micro_batches: int | None = None
) -> np.ndarray:
    """G(T): the most work a pipeline of this scheme can finish within `T` (inverse of g)."""
    alpha, beta = pipeline_pieces(coef, max_micro_batches)
    time = np.asarray(time_s, dtype=np.float64)
    most = np.max((time[..., None] - beta) / alpha, axis=-1)
    return np.minimum(most, time - interleaved_overhead_s(coef)) if coef.scheme.v > 1 else most


def build_table(stage_counts: list[int], fwd_fractions: list[float], max_micro_batches: int) -> dict:
    entries = []
    for fwd_fraction in fwd_fractions:
        for stages in stage_counts:
            floors, shapes = [], []
            for count in range(1, max_micro_batches + 1):
                value, shares = solve_floor_lp(stages, count, fwd_fraction)
                floors.append(math.floor(max(0.0, value - SAFETY) * 1e7) / 1e7)
                shapes.append([round(float(share), 4) for share in shares])
            entries.append({"pp": stages, "fwd_fraction": fwd_fraction, "floors": floors, "shapes": shapes})
            print(f"pp={stages} f={fwd_fraction:.4f}: rho_1={floors[0]:.4f} rho_M={floors[-1]:.4f}", flush=True)
    return {
        "schema": TABLE_SCHEMA,
        "about": "rho_m, the least relative 1F1B bubble of m micro-batches; planner/bubble_floor.py",
        "max_micro_batches": max_micro_batches,
        "entries": entries,
    }


def build_interleaved_table(pairs: list[tuple[int, int]], fwd_fractions: list[float], max_micro_batches: int) -> dict:
    entries = []
    for fwd_fraction in fwd_fractions:
        for stages, chunks in pairs:
            counts = list(range(stages, max_micro_batches + 1, stages))
            if not counts:
                continue  # pp above the table's M: no count tabulated (the fill-and-drain floor alone)
            floors = []
            for count in counts:
                value, _ = solve_interleaved_floor_lp(stages, chunks, count, fwd_fraction)
                floors.append(math.floor(max(0.0, value - SAFETY) * 1e7) / 1e7)
            entries.append(
                {"pp": stages, "v": chunks, "fwd_fraction": fwd_fraction, "counts": counts, "floors": floors}
            )
            print(f"pp={stages} v={chunks} f={fwd_fraction:.4f}: rho_pp={floors[0]:.4f} rho_M={floors[-1]:.4f}")
    return {
        "schema": INTERLEAVED_TABLE_SCHEMA,
        "about": "rho_m, the least relative interleaved 1F1B bubble of m micro-batches; planner/bubble_floor.py",
        "max_micro_batches": max_micro_batches,
        "entries": entries,
    }


def main(argv: list[str] | None = None) -> None:
    """Regenerate both tables (1F1B, interleaved 1F1B) for the bundled models' schemes."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description="re-solve the bubble-floor LPs and write their table")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("data") / TABLE_FILE)
    parser.add_argument(
        "--interleaved-out", type=Path, help=f"the interleaved table (default: {INTERLEAVED_TABLE_FILE} beside --out)"
    )
    parser.add_argument("--max-micro-batches", type=int, default=MAX_MICRO_BATCHES)
    parser.add_argument("--only", choices=("1f1b", "interleaved"), help="regenerate one table only")
    args = parser.parse_args(argv)
    if args.only != "interleaved":
        table = build_table(list(TABULATED_STAGE_COUNTS), [TABULATED_FWD_FRACTION], args.max_micro_batches)
        args.out.write_text(json.dumps(table, indent=None, separators=(",", ":")) + "\n")
        print(f"wrote {args.out}")
    if args.only != "1f1b":
        args.interleaved_out = args.interleaved_out or args.out.with_name(INTERLEAVED_TABLE_FILE)
        table = build_interleaved_table(list(TABULATED_INTERLEAVED), [TABULATED_FWD_FRACTION], args.max_micro_batches)
        args.interleaved_out.write_text(json.dumps(table, indent=None, separators=(",", ":")) + "\n")
        print(f"wrote {args.interleaved_out}")


if __name__ == "__main__":
    main()
