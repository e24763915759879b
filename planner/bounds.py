"""Valid lower bounds on the step time of any plan whose strategy uses a given set of schemes.

For a strategy over scheme set Q on N GPUs, every plan satisfies (times in seconds):

* **area**: a pipeline with scheme s runs its stage 0 through every micro-batch, so its time is at
  least `sum(w_i) + c_s * m` with `w_i = a_s l_i^2 + b_s l_i` and `m >= tokens / capacity_s`.
  Weighting each pipeline by its GPUs and summing, `N * T >= sum_i min_{s in Q} g_s (w_is +
  c_s l_i / capacity_s)`, where only schemes whose capacity fits item i count.
* **longest item**: the micro-batch holding item i crosses all pp stages forwards and backwards,
  so `T >= min_{s in Q} pp_s (w_is + c_s)`.
* **gradient sync**: the ring all-reduce time grows with the number of weight replicas, which is at
  least one per CP rank of one pipeline of each scheme, and at least `N / max(g_s / cp_s)`.

The step time of the strategy is at least `max(area, longest) + sync`. The minimum of this over all
scheme sets bounds the optimum over the whole strategy space.

With the pipeline counts `n_s` known, a tighter bound follows from Lagrangian duality of the fluid
dispatch LP (each pipeline of scheme s has time >= its items' `u_is = w_is + c_s l_i/cap_s` plus
the bubble floor `K_s = (pp_s - 1) c_s / v_s`, since 1F1B adds at least pp-1 of its smallest
micro-batch and the interleaved schedule with v chunks per rank pp-1 of its smallest chunk's;
`planner.bubble_floor`, items 1 and 3): for every `lambda >= 0`,
`T - sync >= (sum_i min_s lambda_s u_is + sum_s lambda_s n_s K_s) / sum_s lambda_s n_s`.
We take the best `lambda` on a grid of the simplex (any grid point gives a valid bound).

**Bubble floors** (`planner.bubble_floor`) bound a pipeline of scheme s whose items carry work W by
`g_s(W) = W + h_s(W)`, h concave and increasing: micro-batch overheads traded against 1F1B
bubbles. They enter twice:

* per strategy, by iteration: from a valid bound T0, any T >= T0 lets a pipeline carry at most
  `G_s(T) <= T - K'_s` with `K'_s = T0 - G_s(T0)`; the dual above with item costs `w_is` and
  floors `K'_s` is then a valid bound T1, and the step repeats from max(T0, T1);
* per scheme set, for plans that can still beat an incumbent with pipeline times <= T_cap: since
  h(W)/W is non-increasing, every item's work costs at least `w_is (1 + h_s(T_cap)/T_cap)`, and the
  area bound may use that pricing (per scheme, whichever pricing is larger); a set's bound is
  then min(incumbent, area + sync), valid either way.

A pipeline holds at least one item, so none runs more than `items - pipelines + 1` micro-batches:
the floors use only those counts (`BoundTables.num_items`). For strategies whose items are large
against a pipeline, `BoundTables.packing_bounds` adds what the fluid dual cannot see, that items are
not divisible between pipelines (dual feasible functions of bin packing).

Set bounds over many distinct lengths use coarsened rows (lengths within 2%, priced from each row's
shortest length: a lower bound, looser by well under 1%).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from hydraplan.planner.bubble_floor import (
    MAX_CAPPED_MICRO_BATCHES,
    fill_drain_floor_s,
    largest_micro_batch_floor_s,
    most_work_s,
    pipeline_time_floor_s,
)
from hydraplan.planner.cost import ProfileCostModel, SchemeCoefficients
from hydraplan.planner.kernels import set_bounds_depth_first, weighted_min_totals

COARSE_RATIO = 1.02  # row span of coarsened tables (see `BoundTables.coarsened`)
# `BoundTables.packing_bounds`: the dual feasible functions tried, the items they can price, the
# bisection steps (each halves the interval up to the incumbent) and a memory cap per chunk of rows
DFF_THRESHOLDS = (0.2, 0.25, 0.3, 1 / 3, 0.4, 0.45, 0.5)  # eps of f_eps
DFF_STEPS = (2, 3, 4)  # k of u_k
BIG_ITEM_SHARE = min(*DFF_THRESHOLDS, *(1 / (k + 1) for k in DFF_STEPS))  # every function maps smaller sizes to 0
NUM_DFFS = len(DFF_THRESHOLDS) + len(DFF_STEPS)
# the functions by name, in the order of `dual_feasible_images` (a certificate names them)
DFF_NAMES = tuple(f"f_eps({Fraction(eps).limit_denominator(20)})" for eps in DFF_THRESHOLDS) + tuple(
    f"u_k({k})" for k in DFF_STEPS
)
# functions a packing bound may mix, one per scheme (each pipeline's images sum to at most 1 under
# its own scheme's function): "at most k large items per pipeline" for k = 1 (f_eps(1/2)) to 4
# (u_k(4)). A strategy of one <2,1,4> and 13 <2,1,2> pipelines for 17 items of 32K tokens (8B / 64
# H100 LongAlign): each <2,1,2> holds one (size 0.51), the <2,1,4> three (0.26); no function alike
# on both sees that 17 > 13 + 3, f_eps(1/2) on the one and u_k(3) on the other does
MIXED_DFFS = tuple(DFF_NAMES.index(name) for name in ("f_eps(1/2)", "u_k(2)", "u_k(3)", "u_k(4)"))
MAX_MIXED_SCHEMES = 3  # 4^3 - 4 mixes for three schemes; sets of more schemes use functions alike
ITEM_CAP_ROUNDS = 3  # rounds of the item-count cap per scheme (each can only lower the room)
PACKING_PROBE_STEP = 0.002  # rows not infeasible this far above their start are left as they are
PACKING_BISECTIONS = 12
# the packing bounds' search for multipliers beyond their grid, at the probe of each row: patches of
# the simplex around the best point so far, ever finer (points spaced 1/level, PATCH_RADIUS of them
# each way)
PATCH_RESOLUTIONS = (24, 48, 96, 192)
PATCH_RADIUS = 3
# a raised bound is claimed this much (relative) below the time its multipliers proved infeasible:
# the certificate rounds them (`planner.certificate.MULTIPLIER_DIGITS`), and the slack keeps the
# rounded ones a proof
PACKING_PROOF_SLACK = 1e-5
PACKING_CHUNK_ELEMENTS = 4_000_000
SET_PACKING_STEP = 0.003  # grid of step times of `BoundTables.set_packing_bounds_s` (ratio - 1) ...
SET_PACKING_POINTS = 64  # ... and its most points, tried in chunks of
SET_PACKING_CHUNK_POINTS = 8
IDENTITY_MAX_ROWS = 400  # the identity function prices every item: only over this many lengths
FLOAT_SLACK = 1e-9
# the packing bound's mixed functions price with every multiplier at least this: an item that cannot
# go to a scheme (size 1e30) then never goes to it free when its multiplier is 0 (1e30 * 0 = 0 lets
# it, and no plan can put it there), so a scheme that holds none of the large items can drop out of
# the proof. Valid: those multipliers prove `sum_i min_s lambda_s f_s(x_is) <= lambda . n`, which
# exceeds the one checked, with the original lambda, by at most PACKING_LEAST_WEIGHT per pipeline,
# far inside its 1e-12 slack. Not for the functions alike: there the many points that then tie at
# 0 on the simplex's corners led the search for multipliers away from the proof (a 32B / 64 A100
# SFT-mix strategy of three deep pipelines lost its packing bound, 4.63 -> 4.53 s), as the mixed
# functions do where they do not prove the time outright (`packing_bounds`)
PACKING_LEAST_WEIGHT = 1e-20


@dataclass(frozen=True)
class BoundTables:
    """Per unique item length (rows) and scheme (columns): the costs the bounds minimise."""

    coefs: tuple[SchemeCoefficients, ...]
    gpu_seconds: np.ndarray  # g_s * (w_is + c_s l_i / cap_s), inf where item i does not fit s
    work_s: np.ndarray  # w_is = a_s l_i^2 + b_s l_i, inf where item i does not fit s
    longest_s: np.ndarray  # pp_s * (w_is + c_s), inf where item i does not fit s
    multiplicity: np.ndarray  # how many items have this length (rows of coarsened tables: 1)
    lengths: np.ndarray  # the unique item lengths (rows; coarsened: the row's longest)
    num_items: int  # items in all: a plan's pipelines each hold one, so none runs more micro-batches

    @classmethod
    def build(cls, lengths: np.ndarray, coefs: Sequence[SchemeCoefficients]) -> BoundTables:
        unique, multiplicity = np.unique(lengths, return_counts=True)
        as_float = unique.astype(np.float64)
        return cls._of_rows(coefs, as_float, as_float, as_float, multiplicity.astype(np.float64), len(lengths))

    @classmethod
    def _of_rows(
        cls, coefs, low: np.ndarray, high: np.ndarray, tokens: np.ndarray, multiplicity: np.ndarray, num_items: int
    ):
        """Rows of items whose lengths lie in [low, high] and that hold `tokens` tokens in all, each
        row counted `multiplicity` times. Item work `a l^2 + b l >= (a low + b) l` is priced by that
        floor (exact when low = high), fit and the longest-item bound by `high`."""
        low, high, tokens = low[:, None], high[:, None], tokens[:, None]
        a = np.array([coef.a for coef in coefs])[None, :]
        b = np.array([coef.b for coef in coefs])[None, :]
        c = np.array([coef.c for coef in coefs])[None, :]
        capacity = np.array([coef.capacity_tokens for coef in coefs], dtype=np.float64)[None, :]
        gpus = np.array([coef.scheme.num_gpus for coef in coefs], dtype=np.float64)[None, :]
        stages = np.array([coef.scheme.pp for coef in coefs], dtype=np.float64)[None, :]
        work = (a * low + b) * tokens
        fits = high <= capacity
        gpu_seconds = np.where(fits, gpus * (work + c * tokens / capacity), np.inf)
        longest = np.where(fits, stages * (a * high * high + b * high + c), np.inf)
        work = np.where(fits, work, np.inf)
        return cls(tuple(coefs), gpu_seconds, work, longest, multiplicity, high[:, 0], num_items)

    def coarsened(self, ratio: float = COARSE_RATIO) -> BoundTables:
        """Tables with lengths grouped into rows spanning at most `ratio` (never across a
        capacity), for cheap set bounds over many distinct lengths. Still valid: each item's work
        is priced from its row's shortest length, which loosens the attention term by < ratio - 1."""
        capacities = np.array(sorted({coef.capacity_tokens for coef in self.coefs}), dtype=np.float64)
        side = np.searchsorted(capacities, self.lengths, side="left")  # capacities below each length
        starts = [0]
        for row in range(1, len(self.lengths)):
            if self.lengths[row] > self.lengths[starts[-1]] * ratio or side[row] != side[starts[-1]]:
                starts.append(row)
        ends = [*starts[1:], len(self.lengths)]
        tokens = np.add.reduceat(self.lengths * self.multiplicity, starts)
        low, high = self.lengths[starts], self.lengths[np.asarray(ends) - 1]
        return self._of_rows(self.coefs, low, high, tokens, np.ones(len(starts)), self.num_items)

    def bubble_priced(self, pipeline_time_cap_s: float) -> BoundTables:
        """These tables with each scheme's items priced by the better of the capacity pricing and
        the bubble pricing `g_s (w_is (1 + h_s(T_cap) / T_cap))`, valid for plans whose pipelines
        all finish within `T_cap` (see the module docstring)."""
        if not math.isfinite(pipeline_time_cap_s) or pipeline_time_cap_s <= 0:
            return self
        priced = self.gpu_seconds.copy()
        for column, coef in enumerate(self.coefs):
            overhead = float(pipeline_time_floor_s(coef, pipeline_time_cap_s, self.num_items)) - pipeline_time_cap_s
            factor = 1.0 + max(0.0, overhead) / pipeline_time_cap_s
            bubbled = coef.scheme.num_gpus * self.work_s[:, column] * factor
            fits = np.isfinite(bubbled)
            if fits.any() and self.multiplicity[fits] @ bubbled[fits] > self.multiplicity[fits] @ priced[fits, column]:
                priced[:, column] = bubbled
        return dataclasses.replace(self, gpu_seconds=priced)

    def pipeline_time_bound_s(self, columns: Sequence[int], num_gpus: int) -> float:
        """max(area, longest) for scheme set `columns`; inf when some item fits none of them."""
        columns = list(columns)
        cheapest = self.gpu_seconds[:, columns].min(axis=1)
        if not np.isfinite(cheapest).all():
            return math.inf
        area = float(cheapest @ self.multiplicity) / num_gpus
        longest = float(self.longest_s[:, columns].min(axis=1).max())
        return max(area, longest)

    def longest_fitting(self, column: int) -> float:
        """Length of the longest item that fits scheme `column` (0 if none)."""
        fits = np.isfinite(self.gpu_seconds[:, column])
        return float(self.lengths[fits].max()) if fits.any() else 0.0

    def all_set_bounds(
        self, max_schemes: int, num_gpus: int, cutoff_s: float = math.inf
    ) -> Iterator[tuple[tuple[int, ...], float]]:
        """(columns, max(area, longest)) of every set of at most `max_schemes` schemes that can
        hold every item and whose bound is below `cutoff_s`."""
        for prefix, children, bounds in self.set_bound_blocks(max_schemes, num_gpus, cutoff_s):
            for child, bound in zip(children.tolist(), bounds.tolist()):
                yield (*prefix, child), bound

    def set_bound_blocks(
        self, max_schemes: int, num_gpus: int, cutoff_s: float = math.inf, first_column: int = 0
    ) -> Iterator[tuple[tuple[int, ...], np.ndarray, np.ndarray]]:
        """`all_set_bounds` in blocks `(prefix, children, bounds)`: the sets `prefix + (child,)`
        for the later columns `child` whose bound is below `cutoff_s`, each prefix extended by all
        later columns at once (vectorised). Prefixes come in lexicographic order, each before its
        children's. With `first_column` > 0 only the blocks of prefixes that start at that column
        or later (the single schemes' block, of prefix (), is left out too). The walk is
        `kernels.set_bounds_depth_first`, one first column's subtree per call."""
        num_columns = self.gpu_seconds.shape[1]
        roots = [(-1, 0)] if first_column == 0 else []  # the empty prefix's block: single columns
        if max_schemes > 1:
            roots += [(column, column + 1) for column in range(first_column, num_columns)]
        tables = (
            np.ascontiguousarray(self.gpu_seconds, dtype=np.float64),
            np.ascontiguousarray(self.longest_s, dtype=np.float64),
            np.ascontiguousarray(self.multiplicity, dtype=np.float64),
        )
        for first_root, root_end in roots:  # one subtree at a time: a caller may stop between them
            prefixes, starts, children, bounds = set_bounds_depth_first(
                *tables, num_gpus, max_schemes, float(cutoff_s), first_root, root_end
            )
            for row, start, end in zip(prefixes.tolist(), starts[:-1].tolist(), starts[1:].tolist()):
                yield tuple(column for column in row if column >= 0), children[start:end], bounds[start:end]

    def replica_split_bounds_s(
        self, sets: Sequence[tuple[int, ...]], num_gpus: int, sync_floors: SyncFloors
    ) -> np.ndarray:
        """Set bounds (pipeline time + sync) that couple the area to the weight replicas.

        The plain set bound prices every item on its cheapest scheme and the sync at the fewest
        replicas any strategy of the set may have; cheap schemes are often the ones with many
        replicas. For a threshold R, a strategy with R or more replicas syncs at least
        `sync(R)`; one with fewer obeys `sum_s cp_s n_s <= R - 1`. With `y_s = n_s T` (pipeline
        time available on s), `sum_s g_s y_s = N T` and `sum_s cp_s y_s <= (R-1) T`, so for every
        `mu >= 0`: `T >= sum_i min_s (g_s + mu cp_s) u_is / (N + mu (R-1))`. A set's bound is the
        lesser of the two cases, maximised over a few thresholds R and weights mu (vectorised over
        the sets; a set of fewer than three schemes repeats its first).
        """
        padded = _padded(sets)
        priced = self.gpu_seconds[:, padded]  # rows x sets x 3
        longest = least_of_last(self.longest_s[:, padded]).max(axis=0)
        per_gpu = np.array([coef.scheme.cp / coef.scheme.num_gpus for coef in self.coefs])[padded]  # sets x 3
        area = np.maximum(self.multiplicity @ least_of_last(priced) / num_gpus, longest)
        weights = num_gpus * np.array([0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0])
        factors = 1.0 + weights[None, :, None] * per_gpu[:, None, :]  # sets x mu x 3
        numerators = np.tensordot(self.multiplicity, weighted_min(priced, factors), axes=1)
        plain_sync = np.array([sync_floors(columns) for columns in sets])
        fewest = np.array([sync_floors.fewest_replicas(columns) for columns in sets])
        most = np.floor(num_gpus * per_gpu.max(axis=1) + 1e-9).astype(np.int64)
        grown = np.round(fewest[:, None] * 1.5 ** np.arange(1, 12))
        thresholds = np.minimum(most[:, None], np.maximum(fewest[:, None] + 1, grown))
        widest = [sync_floors.widest(columns) for columns in sets]
        many = area[:, None] + np.array(
            [[sync_floors.of(int(t), w) for t in row] for row, w in zip(thresholds.tolist(), widest)]
        )
        few = (numerators[:, None, :] / (num_gpus + weights[None, None, :] * (thresholds[:, :, None] - 1))).max(axis=2)
        split = np.minimum(many, np.maximum(few, longest[:, None]) + plain_sync[:, None])
        split = np.where(thresholds > fewest[:, None], split, -np.inf)
        return np.maximum(area + plain_sync, split.max(axis=1))

    def fluid_costs(self, columns: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The fluid relaxation's terms for the schemes `columns`: each item's cost on one pipeline
        of each (`u_is`, rows x columns, inf where it does not fit) and each pipeline's bubble floor
        `K_s = (pp_s - 1) c_s / v_s` (`bubble_floor.fill_drain_floor_s`). Shared by the dual bounds
        here and the estimates of `planner.fluid`."""
        columns = list(columns)
        gpus = np.array([self.coefs[column].scheme.num_gpus for column in columns], dtype=np.float64)
        floors = np.array([fill_drain_floor_s(self.coefs[column]) for column in columns])
        return self.gpu_seconds[:, columns] / gpus[None, :], floors

    def count_bounds(
        self,
        columns: Sequence[int],
        counts: np.ndarray,
        resolution: int = 12,
        cutoff_s: np.ndarray | float = math.inf,
        extra: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each row of `counts` (pipelines per scheme of `columns`): the dual fluid bound on
        the slowest pipeline, and that maxed with the area, longest-item and bubble-floor bounds;
        see the module docstring. Every row must fill the same GPUs (the area bound is taken at the
        first row's). Rows whose bound already reaches `cutoff_s` skip the (costlier) bubble
        floors. `extra` multipliers (points x columns) join the grid."""
        columns = list(columns)
        grid, ratios = self._fluid_ratios(columns, counts, resolution, extra)
        fluid = ratios.max(axis=1)
        counts = counts.astype(np.float64)
        gpus = np.array([self.coefs[column].scheme.num_gpus for column in columns], dtype=np.float64)
        bound = np.maximum(fluid, self.pipeline_time_bound_s(columns, int(round(counts[0] @ gpus))))
        if any(self.coefs[column].scheme.pp > 1 for column in columns):
            bound = self._bubble_dual(columns, counts, grid, bound, np.broadcast_to(cutoff_s, bound.shape))
        return fluid, bound

    def fluid_multipliers(self, columns: Sequence[int], counts: np.ndarray, resolution: int = 12) -> np.ndarray:
        """Per row of `counts`: the grid point `lambda` of `count_bounds`' fluid dual that gives the
        row its best dual bound (the witness a bound certificate carries: rows x columns)."""
        grid, ratios = self._fluid_ratios(list(columns), counts, resolution)
        return grid[ratios.argmax(axis=1)]

    def refined_dual_bounds(
        self,
        columns: Sequence[int],
        counts: np.ndarray,
        start: np.ndarray,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Raise valid bounds `start` (per row of `counts`) with `count_bounds` at multipliers off
        its grid: per row, the fluid dual's best point, searched in ever finer patches around the
        grid's best (`PATCH_RESOLUTIONS`), joins the grid. Returns the bounds and per row that point
        where it raised the row's bound (NaN elsewhere): with it, the duals' grid proves the bound.

        The fluid dual is a ratio of a concave function of the multipliers to a linear one, so
        quasi-concave, and its maximum is sharp: on 32B / 64 A100 lognormal batches, for strategies
        of two or three deep pipelines, the fluid dual's best point on a grid of 192 raised the
        bubble-floor dual 2.6-5.2% over the grid of 12, and that one point added to the grid of 12
        gave all of it. `should_stop` is asked before each row's duals (a step each: about what a
        bisection step of `packing_bounds` costs); the rows after a stop keep their start."""
        columns = list(columns)
        counts = np.asarray(counts)
        witnesses = np.full((len(counts), len(columns)), np.nan)
        offsets = _simplex_patch(len(columns))
        if not len(counts) or not len(offsets):
            return start, witnesses
        grid, ratios = self._fluid_ratios(columns, counts, 12)
        here = np.arange(len(counts))
        point, value = grid[ratios.argmax(axis=1)], ratios.max(axis=1)
        for level in PATCH_RESOLUTIONS:
            near = np.maximum(point[:, None, :] + offsets[None] / level, 0.0)  # rows x points x columns
            near /= near.sum(axis=2, keepdims=True)
            _, tried = self._fluid_ratios(columns, counts, 12, near.reshape(-1, len(columns)))
            tried = tried[:, len(grid) :].reshape(len(counts), len(counts), len(offsets))[here, here]  # its own
            pick = tried.argmax(axis=1)
            best_tried = tried[here, pick]
            gain = best_tried > value
            point[gain] = near[here, pick][gain]
            value[gain] = best_tried[gain]
        result = start.copy()
        for row in here:
            if should_stop():
                break
            _, raised = self.count_bounds(columns, counts[row : row + 1], extra=point[row : row + 1])
            if raised[0] > result[row]:
                result[row], witnesses[row] = raised[0], point[row]
        return result, witnesses

    def _fluid_ratios(
        self, columns: list[int], counts: np.ndarray, resolution: int, extra: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The fluid dual's grid of multipliers `lambda` (points x columns, the GPU shares, then
        `extra`) and its bound at every point for every row of `counts` (rows x points)."""
        gpus = np.array([self.coefs[column].scheme.num_gpus for column in columns], dtype=np.float64)
        per_pipeline, floors = self.fluid_costs(columns)
        # an item that does not fit a scheme may only be priced there at zero weight: a finite
        # stand-in keeps 0 * inf out; it can only lower (never invalidate) the bound
        per_pipeline = np.where(np.isfinite(per_pipeline), per_pipeline, 1e30)
        points = [simplex_grid(len(columns), resolution), gpus / gpus.sum()]
        grid = np.vstack(points if extra is None else [*points, extra])
        totals = weighted_min_totals(np.ascontiguousarray(per_pipeline), grid, self.multiplicity)
        counts = counts.astype(np.float64)
        return grid, (totals[None, :] + (counts * floors[None, :]) @ grid.T) / (counts @ grid.T)

    def packing_bounds(
        self,
        columns: Sequence[int],
        counts: np.ndarray,
        start: np.ndarray,
        cutoff_s: np.ndarray,
        resolution: int = 12,
        should_stop: Callable[[], bool] = lambda: False,
        closer_every_step: bool = False,
        mixed_functions: bool = False,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raise valid bounds `start` on the slowest pipeline (per row of `counts`, below a finite
        `cutoff_s`) where items are large against a pipeline: they cannot be split between
        pipelines. Costlier than `count_bounds`; for the strategies that hold a bound down.
        Returns the bounds and, per row, the multipliers `lambda` that prove its raised bound
        (NaN where the bound was not raised) and the functions they price each scheme with
        (indices of DFF_NAMES; -1 where the functions alike prove it): a verifier needs only those
        to re-prove it.

        A pipeline of scheme s that finishes by T carries work at most `G_s(T)`: the bubble floor
        over at most k micro-batches, k the most items it can hold (at most `items - pipelines +
        1`, and no more than the lightest items that fit in `G_s(T)`). An item of work w fits it
        only if `w + E_s(w) <= T` (largest-micro-batch floor), and leaves at most `T - E_s(w)` for
        the whole pipeline. With sizes `x_is = w_is / min(G_s(T), T - E_s(w_is))` the items of one
        pipeline sum to at most 1 (`_ItemSizes.sizes`), and so do their images under a dual
        feasible function f (Fekete & Schepers 2001, "New classes of fast lower bounds for bin
        packing problems"): the identity (over every item, for tables of at most
        IDENTITY_MAX_ROWS lengths), `f_eps(x) = 1 if x > 1 - eps, x if eps <= x <= 1 - eps, 0
        below eps` (eps <= 1/2) and `u_k(x) = x if (k+1) x is an integer, else floor((k+1) x) / k`.
        A plan with `n_s` pipelines of scheme s then has, for every `lambda >= 0`,
        `sum_i min_s lambda_s f(x_is) <= sum_s lambda_s n_s`; a T that violates this for some f
        and `lambda` (or leaves an item no scheme) is infeasible, and infeasibility is monotone in
        T (sizes only shrink as T grows, and every f is non-decreasing: the same f and `lambda`
        prove every shorter T), so bisection gives the bound. Items with `x_is < BIG_ITEM_SHARE`
        for every scheme map to 0 under every f but the identity and are left out. Each scheme
        may also price its items by its own function f_s, since each pipeline's images sum to at
        most 1 under its scheme's: `sum_i min_s lambda_s f_s(x_is) <= sum_s lambda_s n_s`. With
        `mixed_functions`, the rows the functions alike leave unproved at the probe try every mix
        of MIXED_DFFS on the grid (a step), and a mix that proves the probe stays tried beside
        the functions alike through the bisection.

        `lambda` is searched per row: the simplex grid of `resolution` and the row's best point so
        far; at the probe (and with `closer_every_step` at every bisection step), where those prove
        nothing, ever finer patches of points around the best (`PATCH_RESOLUTIONS`), while each
        finds a better point. The proof is sharp in `lambda`: on a 32B / 64 A100 lognormal batch
        the grid of 12 raised none of the strategies of few deep pipelines that held its bound, and
        the patches raised them 3-7%. `should_stop` is asked before each bisection step and each
        patch (a patch costs about what the grid does) and ends the search early: what it proved so
        far stands."""
        columns = list(columns)
        grid = simplex_grid(len(columns), resolution)
        counts = counts.astype(np.float64)
        witnesses = np.full((len(counts), len(columns)), np.nan)
        functions = np.full((len(counts), len(columns)), -1, dtype=np.int64)
        finite = np.isfinite(start) & np.isfinite(cutoff_s) & (start < cutoff_s)
        if not finite.any():
            return start, witnesses, functions
        lo, hi, rows = start[finite], cutoff_s[finite].astype(np.float64), counts[finite]
        sizes = _ItemSizes(self, columns, float(lo.min()))
        if not sizes.useful:
            return start, witnesses, functions
        caps = self._most_micro_batches(rows)
        per_point = max(sizes.work.size * NUM_DFFS, sizes.all_work.size)
        offsets = _simplex_patch(len(columns))
        mixes = _function_mixes(len(columns) if mixed_functions and sizes.work.size else 1)
        best = np.repeat(grid[:1], len(lo), axis=0)  # per row: the multipliers that came closest so far
        # ... and the functions they price each scheme's items with (-1: every function, alike)
        chosen = np.full((len(lo), len(columns)), -1, dtype=np.int64)
        proof = np.full((len(lo), len(columns)), np.nan)  # per row: those that proved its `lo`
        proof_functions = np.full((len(lo), len(columns)), -1, dtype=np.int64)

        def available(subset: np.ndarray, points: np.ndarray) -> np.ndarray:
            """Rows x points: the weighted pipeline count, with slack for float noise."""
            return np.einsum("rs,rps->rp", rows[subset], points) * (1 + FLOAT_SLACK) + 1e-12

        def violations(time_s: np.ndarray, subset: np.ndarray, points: np.ndarray) -> np.ndarray:
            """Rows (of `subset`) x points: how far the items' images at `time_s` exceed the pipelines
            at each row's `points` (rows x points x schemes), the most over the functions (alike on
            every scheme); > 0 proves the row's time infeasible."""
            room = sizes.rooms(time_s, caps[subset])
            result = np.full(points.shape[:2], -np.inf)
            chunk = max(1, PACKING_CHUNK_ELEMENTS // (per_point * points.shape[1]))
            for first in range(0, len(time_s), chunk):
                part = slice(first, first + chunk)
                weights = points[part, None]  # rows x 1 x points x schemes
                free = available(subset[part], points[part])
                # 0 * 1e30 = 0 below: an item may go free to a scheme of zero weight (valid, weaker;
                # the mixed functions' search prices it there with PACKING_LEAST_WEIGHT instead)
                if sizes.work.size:
                    priced = weighted_min(sizes.images(time_s[part], room[part]), weights)  # f x rows x items x points
                    used = np.tensordot(priced, sizes.multiplicity, axes=([2], [0])).max(axis=0)
                    result[part] = np.maximum(result[part], used - free)
                if sizes.identity:
                    every = sizes.sizes(time_s[part], room[part], every=True)  # rows x items x schemes
                    used = np.einsum("rip,i->rp", weighted_min(every, weights), sizes.all_multiplicity)
                    result[part] = np.maximum(result[part], used - free)
            return result

        def mixed_violations(time_s: np.ndarray, subset: np.ndarray, points: np.ndarray) -> np.ndarray:
            """As `violations`, each row's items priced per scheme by its own function (`chosen`)."""
            room = sizes.rooms(time_s, caps[subset])
            images = sizes.images(time_s, room)  # f x rows x items x schemes
            picked = images[
                chosen[subset][:, None, :],
                np.arange(len(subset))[:, None, None],
                np.arange(images.shape[2])[None, :, None],
                np.arange(len(columns))[None, None, :],
            ]  # rows x items x schemes
            priced = weighted_min(picked, np.maximum(points[:, None], PACKING_LEAST_WEIGHT))  # rows x items x points
            return np.einsum("rip,i->rp", priced, sizes.multiplicity) - available(subset, points)

        def evaluate(time_s: np.ndarray, subset: np.ndarray, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """Rows x points: the most violation by functions alike (`violations`) and, for the rows
            that have mixed functions, by those; and where the mixed ones gave it."""
            result = violations(time_s, subset, points)
            mixed = np.zeros(result.shape, dtype=bool)
            which = np.flatnonzero(chosen[subset, 0] >= 0)
            if which.size:
                tried = mixed_violations(time_s[which], subset[which], points[which])
                mixed[which] = tried > result[which]
                result[which] = np.maximum(result[which], tried)
            return result, mixed

        def best_mix(time_s: np.ndarray, subset: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """Per row: the most violation over the grid and every mix of functions (`_function_mixes`),
            its point and its functions."""
            value = np.full(len(subset), -np.inf)
            point = np.zeros(len(subset), dtype=np.int64)
            mix = np.zeros(len(subset), dtype=np.int64)
            weights = np.maximum(grid, PACKING_LEAST_WEIGHT)
            chunk = max(1, PACKING_CHUNK_ELEMENTS // (len(MIXED_DFFS) * len(columns) * sizes.work.size * len(grid)))
            for first in range(0, len(subset), chunk):
                part = slice(first, first + chunk)
                here = np.arange(len(subset))[part]
                room = sizes.rooms(time_s[part], caps[subset[part]])
                images = sizes.images(time_s[part], room)[list(MIXED_DFFS)]  # mixed f x rows x items x schemes
                # per scheme: each function's weighted images, mixed f x rows x items x points
                weighted = [images[..., place, None] * weights[:, place] for place in range(len(columns))]
                free = available(subset[part], np.broadcast_to(grid, (len(here), *grid.shape)))
                for index, row in enumerate(mixes):
                    priced = weighted[0][row[0]]
                    for place in range(1, len(columns)):
                        priced = np.minimum(priced, weighted[place][row[place]])
                    excess = np.einsum("rip,i->rp", priced, sizes.multiplicity) - free
                    top = excess.argmax(axis=1)
                    most = excess[np.arange(len(here)), top]
                    gain = most > value[here]
                    value[here[gain]], point[here[gain]], mix[here[gain]] = most[gain], top[gain], index
            return value, grid[point], np.asarray(MIXED_DFFS)[mixes[mix]]

        def infeasible(time_s: np.ndarray, subset: np.ndarray, closer: bool = False, mixing: bool = False):
            here = np.arange(len(subset))
            on_grid, _ = evaluate(time_s, subset, np.broadcast_to(grid, (len(subset), *grid.shape)))
            starts = np.stack([grid[on_grid.argmax(axis=1)], best[subset]], axis=1)
            found, by_mix = evaluate(time_s, subset, starts)
            pick = found.argmax(axis=1)
            point, value, mixed = starts[here, pick], found[here, pick], by_mix[here, pick]
            which = np.flatnonzero(value <= 0)
            # rows not proved yet: each scheme's items by its own function (a step: ~the grid's cost).
            # A row keeps a mix that proves it, and its functions alike stay tried beside it; one that
            # only comes closer is not taken: many points tie at 0 on the simplex's corners, where the
            # patches found nothing (a 32B SFT-mix strategy lost its packing bound, 4.63 -> 4.53 s)
            if mixing and len(mixes) and which.size and not should_stop():
                tried, tried_point, tried_functions = best_mix(time_s[which], subset[which])
                gain = tried > np.maximum(value[which], 0.0)
                value[which[gain]], point[which[gain]], mixed[which[gain]] = tried[gain], tried_point[gain], True
                chosen[subset[which[gain]]] = tried_functions[gain]
            looking = value <= 0  # rows not proved yet: look closer around their best point
            for level in PATCH_RESOLUTIONS if closer and len(offsets) else ():
                which = np.flatnonzero(looking)
                if not which.size or should_stop():  # a patch costs about what the grid does: a step
                    break
                near = point[which, None, :] + offsets[None] / level
                near = np.where((near >= 0).all(axis=2, keepdims=True), near, point[which, None, :])
                tried, by_mix = evaluate(time_s[which], subset[which], near)
                picks, pick = np.arange(len(which)), tried.argmax(axis=1)
                best_tried = tried[picks, pick]
                gain = best_tried > value[which]
                point[which[gain]] = near[picks[gain], pick[gain]]
                value[which[gain]] = best_tried[gain]
                mixed[which[gain]] = by_mix[picks[gain], pick[gain]]
                looking[which[~gain]] = False  # nothing better this close: finer patches of it neither
                looking &= value <= 0
            best[subset] = point
            proved = value > 0
            proof[subset[proved]] = point[proved]
            proof_functions[subset[proved]] = np.where(mixed[proved, None], chosen[subset[proved]], -1)
            return proved

        # most rows gain nothing: one probe just above the start keeps the bisection to the others
        probe = np.minimum(lo * (1 + PACKING_PROBE_STEP), hi)
        worth = np.flatnonzero(infeasible(probe, np.arange(len(lo)), closer=True, mixing=True))
        lo[worth] = probe[worth]
        for _ in range(PACKING_BISECTIONS if worth.size else 0):
            if should_stop():
                break  # every step so far proved its lower end: stopping early stays valid
            mid = (lo[worth] + hi[worth]) / 2
            above = infeasible(mid, worth, closer_every_step)  # writes the proofs of the rows it proves
            lo[worth] = np.where(above, mid, lo[worth])
            hi[worth] = np.where(above, hi[worth], mid)
        result = start.copy()
        raised = np.maximum(start[finite], np.where(np.isnan(proof[:, 0]), lo, lo * (1 - PACKING_PROOF_SLACK)))
        result[finite] = raised
        gained = raised > start[finite]
        witnesses[finite] = np.where(gained[:, None], proof, np.nan)
        functions[finite] = np.where(gained[:, None], proof_functions, -1)
        return result, witnesses, functions

    def set_packing_bounds_s(
        self,
        sets: Sequence[tuple[int, ...]],
        num_gpus: int,
        sync_floors: SyncFloors,
        start_s: np.ndarray,
        cap_s: float,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> np.ndarray:
        """Raise valid set bounds `start_s` (step times, each at most `cap_s`, the incumbent) with
        the packing argument of `packing_bounds`, weighted by GPUs instead of pipeline counts:
        every pipeline of scheme s uses g_s GPUs and its items' images sum to at most 1, so a
        strategy of the set on N GPUs finishing its pipelines by T has
        `sum_i min_s g_s f(x_is(T)) <= N`. T is tried on a geometric grid shared by all sets;
        each violated grid point proves on its own that the pipelines need longer (plus the
        set's sync floor). Result <= cap_s, as for every set bound. Only for tables of at most
        IDENTITY_MAX_ROWS lengths (else `start_s` unchanged). `should_stop` is asked between
        chunks of SET_PACKING_CHUNK_POINTS grid points (up to ~0.1 s a batch of 200 sets over
        ~100 lengths): the points tried so far stand."""
        if len(self.lengths) > IDENTITY_MAX_ROWS:
            # measured: over many distinct lengths (Wikipedia batches of 1K-16K sequences) it raised
            # no set, at up to 50 ms a batch of sets
            return np.asarray(start_s, dtype=np.float64)
        syncs = np.array([sync_floors(columns) for columns in sets])
        lows = np.asarray(start_s, dtype=np.float64) - syncs
        low, high = float(lows.min()), cap_s - float(syncs.min())
        if not (0 < low < high and math.isfinite(high)):
            return np.asarray(start_s, dtype=np.float64)
        columns = sorted({column for columns in sets for column in columns})
        sizes = _ItemSizes(self, columns, low)
        if not sizes.useful:
            return np.asarray(start_s, dtype=np.float64)
        gpus = np.array([self.coefs[column].scheme.num_gpus for column in columns], dtype=np.float64)
        padded = np.searchsorted(columns, _padded(sets))  # positions in `columns`
        limit = num_gpus * (1 + FLOAT_SLACK)

        def violated(times: np.ndarray, which: np.ndarray) -> np.ndarray:
            """times x sets (of `which`): whether the GPUs the items need exceed the cluster."""
            room = sizes.rooms(times, np.full(len(times), self.num_items))
            result = np.zeros((len(times), len(which)), dtype=bool)
            priced = []  # (images: f x times x items x columns, 1e30 where misfit; multiplicity)
            if sizes.work.size:
                priced.append((sizes.images(times, room) * gpus, sizes.multiplicity))
            if sizes.identity:
                priced.append((sizes.sizes(times, room, every=True)[None] * gpus, sizes.all_multiplicity))
            for images, multiplicity in priced:
                chunk = max(1, PACKING_CHUNK_ELEMENTS // (images[..., 0].size * 3))
                for first in range(0, len(which), chunk):
                    part = padded[which[first : first + chunk]]
                    cheapest = least_of_last(images[:, :, :, part])  # f x times x items x sets
                    used = np.tensordot(cheapest, multiplicity, axes=([2], [0]))  # f x times x sets
                    result[:, first : first + chunk] |= (used > limit).any(axis=0)
            return result

        # infeasibility is monotone in T: a set feasible just above the least start is feasible at
        # its own start and beyond, and gains nothing; only the others get the whole grid
        worth = np.flatnonzero(violated(np.array([low * (1 + SET_PACKING_STEP)]), np.arange(len(sets)))[0])
        proved = np.full(len(sets), -np.inf)
        if worth.size:
            steps = min(SET_PACKING_POINTS, math.ceil(math.log(high / low) / math.log1p(SET_PACKING_STEP)) + 1)
            times = low * (high / low) ** (np.arange(1, steps + 1) / steps)
            for first in range(0, steps, SET_PACKING_CHUNK_POINTS):
                if first and should_stop():
                    break
                part = times[first : first + SET_PACKING_CHUNK_POINTS]
                found = np.where(violated(part, worth), part[:, None], -np.inf).max(axis=0)
                proved[worth] = np.maximum(proved[worth], found)
        return np.maximum(start_s, np.minimum(cap_s, proved + syncs))

    def _bubble_dual(
        self,
        columns: list[int],
        counts: np.ndarray,
        grid: np.ndarray,
        start: np.ndarray,
        cutoff_s: np.ndarray,
        rounds: int = 2,
    ) -> np.ndarray:
        """Raise valid bounds `start` (per row of `counts`) with the bubble floors g_s: a pipeline
        of scheme s finishing by T carries work at most G_s(T) = T - h_s(G_s(T)), and for T above a
        known bound T0, h_s(G_s(T)) >= K_s = T0 - G_s(T0). The dual bound with floors K_s and item
        costs w_is is then valid, and the step repeats from the raised bound.

        The pipeline that holds the longest item l* also obeys the largest-micro-batch floor
        `T >= W + E_s`, `E_s = c + (pp-1)((1-2f)(c + w_s(l*)) + f c)` (`planner.bubble_floor`;
        interleaved: `E_s = (pp + (pp-1)/v) c`):
        its load is short of T - K_s by `(E_s - K_s)^+` more, which adds
        `min_s lambda_s (E_s - K_s)^+` (over the schemes l* fits) to the dual's numerator."""
        finite = np.isfinite(start) & (start < cutoff_s)
        if not finite.any():
            return start
        work = self.work_s[:, columns]
        work = np.where(np.isfinite(work), work, 1e30)
        totals = weighted_min_totals(np.ascontiguousarray(work), grid, self.multiplicity)
        denominator = counts @ grid.T
        bound = start[finite]
        rows = counts[finite]
        longest_extra = np.array([self._longest_item_floor_s(column) for column in columns])
        caps = self._most_micro_batches(rows)
        for _ in range(rounds):
            # a pipeline that cannot finish any work by T0 (G < 0) may only stay empty: K = T0
            floors = np.stack(
                [bound - np.maximum(_most_work_capped(self.coefs[column], bound, caps), 0.0) for column in columns],
                axis=1,
            )
            excess = np.maximum(longest_extra[None, :] - floors, 0.0)  # rows x columns; 1e30 where l* misfits
            holder = weighted_min(excess, grid)  # rows x grid points
            raised = ((totals[None, :] + (rows * floors) @ grid.T + holder) / denominator[finite]).max(axis=1)
            if not (raised > bound * (1 + 1e-6)).any():
                break
            bound = np.maximum(bound, raised)
        result = start.copy()
        result[finite] = bound
        return result

    def _most_micro_batches(self, counts: np.ndarray) -> np.ndarray:
        """Per row of pipeline counts: the most micro-batches one pipeline can run, since every
        pipeline holds at least one item (`items - pipelines + 1`)."""
        return self.num_items - np.rint(counts.sum(axis=1)).astype(np.int64) + 1

    def _longest_item_floor_s(self, column: int) -> float:
        """E_s of `_bubble_dual` for the longest item; 1e30 (priced out) where it does not fit."""
        item_s = float(self.work_s[-1, column])  # rows are sorted: the last holds the longest item
        return largest_micro_batch_floor_s(self.coefs[column], item_s) if math.isfinite(item_s) else 1e30

    def ideal_counts(self, columns: Sequence[int], num_gpus: int) -> list[float]:
        """Fluid pipeline counts per scheme: each item on its cheapest scheme, loads balanced."""
        sub = self.gpu_seconds[:, columns]
        choice = sub.argmin(axis=1)
        gpu_seconds = np.bincount(choice, weights=sub.min(axis=1) * self.multiplicity, minlength=len(columns))
        total = gpu_seconds.sum()
        return [
            num_gpus * float(share) / total / self.coefs[column].scheme.num_gpus
            for share, column in zip(gpu_seconds, columns)
        ]


def sync_lower_bound_s(cost: ProfileCostModel, coefs: Sequence[SchemeCoefficients], num_gpus: int) -> float:
    """Least gradient-sync time of any strategy using (at least one pipeline of) each scheme."""
    return SyncFloors(cost, coefs, num_gpus)(range(len(coefs)))


class SyncFloors:
    """`sync_lower_bound_s` for many sets of columns of one scheme list, memoised on the two
    things it depends on: the fewest weight replicas and the scheme with the largest shard."""

    def __init__(self, cost: ProfileCostModel, coefs: Sequence[SchemeCoefficients], num_gpus: int) -> None:
        self.cost, self.coefs, self.num_gpus = cost, tuple(coefs), num_gpus
        self._cp = [coef.scheme.cp for coef in coefs]
        self._gpus_per_replica = [coef.scheme.num_gpus / coef.scheme.cp for coef in coefs]
        self._shard = [coef.sync_bytes for coef in coefs]
        self._arrays = (np.array(self._cp), np.array(self._gpus_per_replica), np.array(self._shard))
        self._memo: dict[tuple[int, int], float] = {}

    def least(self) -> float:
        """A floor under the result for every set of columns."""
        replicas = math.ceil(self.num_gpus / max(self._gpus_per_replica))
        narrowest = min(range(len(self.coefs)), key=self._shard.__getitem__)
        return self.cost.grad_sync_for_replicas_s(replicas, [self.coefs[narrowest].scheme])

    def __call__(self, columns: Iterable[int]) -> float:
        columns = list(columns)
        return self.of(self.fewest_replicas(columns), self.widest(columns))

    def widest(self, columns: Sequence[int]) -> int:
        """The column with the largest gradient shard per GPU (the first such)."""
        return max(columns, key=self._shard.__getitem__)

    def fewest_replicas(self, columns: Sequence[int]) -> int:
        """Weight replicas of any strategy with at least one pipeline of each of these columns."""
        return max(
            sum(self._cp[column] for column in columns),
            math.ceil(self.num_gpus / max(self._gpus_per_replica[column] for column in columns)),
        )

    def of(self, fewest_replicas: int, widest: int) -> float:
        """The floor for sets whose fewest replicas and largest-shard column are these."""
        key = (fewest_replicas, widest)
        if key not in self._memo:
            self._memo[key] = self.cost.grad_sync_for_replicas_s(fewest_replicas, [self.coefs[widest].scheme])
        return self._memo[key]

    def extended(self, prefix: Sequence[int], children: np.ndarray) -> np.ndarray:
        """The floors of the sets `prefix + (child,)` for every column in `children`."""
        cp_all, per_replica_all, shard = self._arrays
        cp = cp_all[children] + sum(self._cp[column] for column in prefix)
        per_replica = per_replica_all[children]
        if prefix:
            per_replica = np.maximum(per_replica, max(self._gpus_per_replica[column] for column in prefix))
        replicas = np.maximum(cp, np.ceil(self.num_gpus / per_replica - 1e-9).astype(np.int64))
        widest = children
        if prefix:
            prefix_widest = self.widest(prefix)
            widest = np.where(shard[children] > shard[prefix_widest], children, prefix_widest)
        return np.array([self.of(r, w) for r, w in zip(replicas.tolist(), widest.tolist())])

    def extended_blocks(self, prefixes: Sequence[tuple[int, ...]], block_of: np.ndarray, children: np.ndarray):
        """`extended(prefixes[block_of[k]], [children[k]])[0]` for every k at once (the same
        values): the sets of many blocks of `BoundTables.set_bound_blocks` in one pass."""
        cp_all, per_replica_all, shard = self._arrays
        prefix_cp = np.array([sum(self._cp[column] for column in prefix) for prefix in prefixes], dtype=np.int64)
        prefix_per_replica = np.array(
            [max((self._gpus_per_replica[column] for column in prefix), default=0.0) for prefix in prefixes]
        )
        prefix_widest = np.array([self.widest(prefix) if prefix else -1 for prefix in prefixes], dtype=np.int64)
        cp = cp_all[children] + prefix_cp[block_of]
        per_replica = np.maximum(per_replica_all[children], prefix_per_replica[block_of])
        replicas = np.maximum(cp, np.ceil(self.num_gpus / per_replica - 1e-9).astype(np.int64))
        owner = prefix_widest[block_of]
        owner_shard = np.where(owner >= 0, shard[np.maximum(owner, 0)], -np.inf)
        widest = np.where(shard[children] > owner_shard, children, owner)
        # few distinct (replicas, widest) pairs: one memoised floor each
        width = len(self.coefs)
        unique, inverse = np.unique(replicas * width + widest, return_inverse=True)
        floors = np.array([self.of(int(key) // width, int(key) % width) for key in unique.tolist()])
        return floors[inverse.reshape(-1)]


class _ItemSizes:
    """Items of some scheme columns as the packing bounds see them: work per scheme, the least
    pipeline time that can hold each, the room a pipeline has by a time T, and their sizes.
    Dual feasible functions other than the identity see only the large items (they map the rest
    to 0); the identity sees every item, on tables of at most IDENTITY_MAX_ROWS lengths."""

    def __init__(self, tables: BoundTables, columns: Sequence[int], least_time_s: float) -> None:
        if round(float(tables.multiplicity.sum())) != tables.num_items:
            raise ValueError("packing bounds need one row per item length (coarsened rows merge items)")
        self.coefs = [tables.coefs[column] for column in columns]
        work = tables.work_s[:, list(columns)]
        fits = np.isfinite(work)
        self.all_work = np.where(fits, work, 0.0)
        self.all_multiplicity = tables.multiplicity
        largest = np.stack(
            [largest_micro_batch_floor_s(coef, self.all_work[:, index]) for index, coef in enumerate(self.coefs)],
            axis=1,
        )
        self.all_needs = np.where(fits, self.all_work + largest, np.inf)  # least T of a pipeline holding it
        # sizes only shrink as T grows: an item below BIG_ITEM_SHARE at the least time stays below
        tightest = np.array([float(most_work_s(coef, least_time_s)) for coef in self.coefs])
        self.big = (fits & (work >= BIG_ITEM_SHARE * tightest[None, :])).any(axis=1)
        self.work, self.needs = self.all_work[self.big], self.all_needs[self.big]
        self.multiplicity = tables.multiplicity[self.big]
        self.identity = len(work) <= IDENTITY_MAX_ROWS
        # prefix sums of the lightest items (all of them) per scheme: a pipeline holding k items
        # carries at least the k lightest, which caps how many items (so micro-batches) it holds
        repeats = np.rint(tables.multiplicity).astype(np.int64)
        self.lightest = [np.cumsum(np.repeat(tables.work_s[:, column], repeats)) for column in columns]

    @property
    def useful(self) -> bool:
        return self.identity or bool(self.big.any())

    def rooms(self, time_s: np.ndarray, most_items: np.ndarray) -> np.ndarray:
        """Rows x schemes: the most work one pipeline can carry by `time_s[row]`, holding at most
        `most_items[row]` items (and no more than the lightest items that fit)."""
        result = np.empty((len(time_s), len(self.coefs)))
        for index, (coef, lightest) in enumerate(zip(self.coefs, self.lightest)):
            caps = np.asarray(most_items, dtype=np.int64).copy()
            room = _most_work_capped(coef, time_s, caps)
            for _ in range(ITEM_CAP_ROUNDS):
                fewer = np.maximum(1, np.searchsorted(lightest, room * (1 + FLOAT_SLACK), side="right"))
                # caps above MAX_CAPPED_MICRO_BATCHES price like no cap: lowering one there changes nothing
                shrink = (fewer < caps) & (fewer <= MAX_CAPPED_MICRO_BATCHES)
                if not shrink.any():
                    break
                caps[shrink] = fewer[shrink]
                room[shrink] = _most_work_capped(coef, time_s[shrink], caps[shrink])
            result[:, index] = room
        return result

    def images(self, time_s: np.ndarray, room: np.ndarray) -> np.ndarray:
        """Dual feasible images of the large items' sizes per row (time T, room G_s per scheme):
        functions x rows x items x schemes, 1e30 where the item cannot go. The identity's images
        of every item are `sizes(..., every=True)`."""
        sizes = self.sizes(time_s, room)
        return np.where(sizes < 1e30, dual_feasible_images(np.minimum(sizes, 1.0)), 1e30)

    def sizes(self, time_s: np.ndarray, room: np.ndarray, every: bool = False) -> np.ndarray:
        """`x_is = w_is / R_is` per row (time T, room G_s per scheme): rows x items x schemes,
        1e30 where the item cannot go (the large items, or every item).

        `R_is = min(G_s, T - E_s(w_is))`: a pipeline whose largest item j has
        `W <= T - E_s(w_j) <= T - E_s(w_i)` for each of its items i (E grows with the work), so its
        items' sizes still sum to at most `W / R_js <= 1`, and large items on deep pipelines, which
        leave little room beside them, count for more."""
        work, needs = (self.all_work, self.all_needs) if every else (self.work, self.needs)
        slack = 1 + FLOAT_SLACK  # float noise must never turn a fitting item away
        fits = (needs[None] <= time_s[:, None, None] * slack) & (work[None] <= room[:, None, :] * slack)
        beside = time_s[:, None, None] - (needs - work)[None]  # T - E_s(w_i)
        item_room = np.maximum(np.minimum(room[:, None, :], beside), 1e-300)
        return np.where(fits, np.minimum(work[None] / item_room, 1.0), 1e30)  # true sizes are <= 1


def _padded(sets: Sequence[tuple[int, ...]]) -> np.ndarray:
    """Sets of up to three columns as a sets x 3 array, a shorter set repeating its first column
    (which changes no minimum over the set)."""
    return np.array([(*columns, *[columns[0]] * (3 - len(columns))) for columns in sets])


def _most_work_capped(coef: SchemeCoefficients, time_s: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """`most_work_s` per row, each with its own micro-batch cap (grouped by cap; every cap above
    MAX_CAPPED_MICRO_BATCHES prices like no cap, so those form one group: at 1,024 GPUs the rows'
    thousands of distinct caps made 70K calls, 2 s of a 10 s plan)."""
    result = np.empty(len(time_s))
    caps = np.minimum(caps, MAX_CAPPED_MICRO_BATCHES + 1)
    for cap in np.unique(caps).tolist():
        same = caps == cap
        result[same] = most_work_s(coef, time_s[same], cap)
    return result


def least_of_last(values: np.ndarray) -> np.ndarray:
    """`values.min(axis=-1)` for a short last axis (a scheme set's few columns), by pairwise
    minima: numpy's reduction over a length-3 axis is an order of magnitude slower."""
    least = values[..., 0].copy()
    for index in range(1, values.shape[-1]):
        np.minimum(least, values[..., index], out=least)
    return least


def weighted_min(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`(values[..., None, :] * weights).min(axis=-1)`: for each row of `weights` (..., G, S, or
    G x S) the least weighted value over the last axis S of `values` (..., S), giving (..., G).
    The same products and minima, by pairwise minima over S without the (..., G, S) temporary
    (10-18x faster for the dual grids here)."""
    least = values[..., None, 0] * weights[..., 0]
    term = np.empty_like(least)
    for index in range(1, values.shape[-1]):
        np.multiply(values[..., None, index], weights[..., index], out=term)
        np.minimum(least, term, out=least)
    return least


def dual_feasible_images(sizes: np.ndarray) -> np.ndarray:
    """The images of `sizes` (any shape) under every dual feasible function of
    `BoundTables.packing_bounds`, stacked on a new first axis: sizes that sum to at most 1 have
    images that sum to at most 1, under each function."""
    # each f_eps image is at most f_eps' with eps' = min(eps + FLOAT_SLACK, 1/2), whatever the rounding
    thresholds = [
        np.where(sizes > 1 - eps + FLOAT_SLACK, 1.0, np.where(sizes < eps + FLOAT_SLACK, 0.0, sizes))
        for eps in DFF_THRESHOLDS
    ]
    return np.stack(thresholds + [_step_dff(sizes, k) for k in DFF_STEPS])


def _step_dff(sizes: np.ndarray, k: int) -> np.ndarray:
    """u_k of Fekete & Schepers: x where (k+1) x is an integer, else floor((k+1) x) / k (never
    above it for any size within FLOAT_SLACK of the computed one)."""
    scaled = (k + 1) * sizes
    nearest = np.rint(scaled)
    # within rounding of an integer j the true value is x, (j-1)/k or j/k: take the least
    near = np.maximum(0.0, np.minimum(sizes - FLOAT_SLACK, (nearest - 1) / k))
    return np.where(np.abs(scaled - nearest) <= FLOAT_SLACK, near, np.floor(scaled) / k)


@lru_cache(maxsize=16)
def _simplex_patch(dimension: int) -> np.ndarray:
    """Offsets that stay on the simplex's plane (coordinates summing to 0): every integer vector
    with its first `dimension - 1` coordinates within PATCH_RADIUS (1 above three dimensions), the
    last balancing them; none in one dimension."""
    if dimension == 1:
        return np.zeros((0, 1))
    radius = PATCH_RADIUS if dimension <= 3 else 1
    free = np.array(list(itertools.product(range(-radius, radius + 1), repeat=dimension - 1)), dtype=np.float64)
    offsets = np.hstack([free, -free.sum(axis=1, keepdims=True)])
    offsets.flags.writeable = False
    return offsets


@lru_cache(maxsize=8)
def _function_mixes(dimension: int) -> np.ndarray:
    """Positions in MIXED_DFFS, one per scheme, for every mix of them that is not one function
    alike on every scheme (`packing_bounds` tries those with all its functions): mixes x schemes."""
    if dimension == 1 or dimension > MAX_MIXED_SCHEMES:
        return np.zeros((0, dimension), dtype=np.int64)
    mixes = [mix for mix in itertools.product(range(len(MIXED_DFFS)), repeat=dimension) if len(set(mix)) > 1]
    result = np.array(mixes, dtype=np.int64)
    result.flags.writeable = False
    return result


@lru_cache(maxsize=64)
def simplex_grid(dimension: int, resolution: int) -> np.ndarray:
    """Points of the probability simplex with coordinates in multiples of 1/resolution (dimension
    <= 3), or corners, centre and pairwise midpoints for higher dimensions."""
    if dimension == 1:
        grid = np.ones((1, 1))
    elif dimension <= 3:
        points = [
            combo for combo in itertools.product(range(resolution + 1), repeat=dimension) if sum(combo) == resolution
        ]
        grid = np.asarray(points, dtype=np.float64) / resolution
    else:
        eye = np.eye(dimension)
        pairs = [(eye[i] + eye[j]) / 2 for i in range(dimension) for j in range(i + 1, dimension)]
        grid = np.vstack([eye, np.full((1, dimension), 1 / dimension), *pairs])
    grid.flags.writeable = False
    return grid
