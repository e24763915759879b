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
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from planner.cost import ProfileCostModel, SchemeCoefficients


@dataclass(frozen=True)
class BoundTables:
    """Per unique item length (rows) and scheme (columns): the costs the bounds minimise."""

    coefs: tuple[SchemeCoefficients, ...]
    gpu_seconds: np.ndarray  # g_s * (w_is + c_s l_i / cap_s), inf where item i does not fit s
    longest_s: np.ndarray  # pp_s * (w_is + c_s), inf where item i does not fit s
    multiplicity: np.ndarray  # how many items have this length

    @classmethod
    def build(cls, lengths: np.ndarray, coefs: Sequence[SchemeCoefficients]) -> "BoundTables":
        unique, multiplicity = np.unique(lengths, return_counts=True)
        as_float = unique.astype(np.float64)[:, None]
        a = np.array([coef.a for coef in coefs])[None, :]
        b = np.array([coef.b for coef in coefs])[None, :]
        c = np.array([coef.c for coef in coefs])[None, :]
        capacity = np.array([coef.capacity_tokens for coef in coefs], dtype=np.float64)[None, :]
        gpus = np.array([coef.scheme.num_gpus for coef in coefs], dtype=np.float64)[None, :]
        stages = np.array([coef.scheme.pp for coef in coefs], dtype=np.float64)[None, :]
        work = a * as_float * as_float + b * as_float
        fits = as_float <= capacity
        gpu_seconds = np.where(fits, gpus * (work + c * as_float / capacity), np.inf)
        longest = np.where(fits, stages * (work + c), np.inf)
        return cls(tuple(coefs), gpu_seconds, longest, multiplicity.astype(np.float64))

    def pipeline_time_bound_s(self, columns: Sequence[int], num_gpus: int) -> float:
        """max(area, longest) for scheme set `columns`; inf when some item fits none of them."""
        columns = list(columns)
        cheapest = self.gpu_seconds[:, columns].min(axis=1)
        if not np.isfinite(cheapest).all():
            return math.inf
        area = float(cheapest @ self.multiplicity) / num_gpus
        longest = float(self.longest_s[:, columns].min(axis=1).max())
        return max(area, longest)

    def all_set_bounds(self, max_schemes: int, num_gpus: int) -> Iterator[tuple[tuple[int, ...], float]]:
        """(columns, max(area, longest)) of every set of at most `max_schemes` schemes that can
        hold every item, extending each set by all later columns at once (vectorised)."""
        num_columns = self.gpu_seconds.shape[1]

        def extend(columns: tuple[int, ...], cheapest: np.ndarray, longest: np.ndarray):
            start = columns[-1] + 1 if columns else 0
            if start >= num_columns:
                return
            child_cheapest = np.minimum(cheapest[:, None], self.gpu_seconds[:, start:])
            child_longest = np.minimum(longest[:, None], self.longest_s[:, start:])
            areas = (self.multiplicity @ child_cheapest) / num_gpus
            bounds = np.maximum(areas, child_longest.max(axis=0))
            for offset, bound in enumerate(bounds.tolist()):
                child = (*columns, start + offset)
                if math.isfinite(bound):
                    yield child, bound
                if len(child) < max_schemes:
                    yield from extend(child, child_cheapest[:, offset], child_longest[:, offset])

        infinite = np.full(self.gpu_seconds.shape[0], np.inf)
        yield from extend((), infinite, infinite)

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
    schemes = [coef.scheme for coef in coefs]
    fewest_replicas = max(
        sum(scheme.cp for scheme in schemes),
        math.ceil(num_gpus / max(scheme.num_gpus / scheme.cp for scheme in schemes)),
    )
    return cost.grad_sync_for_replicas_s(fewest_replicas, schemes)
