"""The cost interface the planner needs, and its implementation over a `CostProfile`.

The surface is deliberately small: the planner only ever asks for a scheme's stage time of a
micro-batch, its forward share, its capacity and the gradient-sync time of a strategy. Anything
that can answer these (analytic formulas, profiler fits, a user's file) plugs in through the
`CostProfile` data format produced by `cost_models/`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hydraplan.planner.schemas import CostProfile, SchemeCost, derive_capacity_tokens
from hydraplan.planner.scheme import ParallelScheme


class CostModel(Protocol):
    """What the planner asks of a cost model (times in seconds)."""

    def schemes(self) -> Sequence[ParallelScheme]: ...

    def stage_time_s(self, scheme: ParallelScheme, lengths: Sequence[int]) -> float: ...

    def fwd_fraction(self, scheme: ParallelScheme) -> float: ...

    def capacity_tokens(self, scheme: ParallelScheme) -> int: ...

    def grad_sync_s(self, pipeline_schemes: Sequence[ParallelScheme]) -> float: ...


@dataclass(frozen=True)
class SchemeCoefficients:
    """One scheme's costs in seconds, capacity resolved."""

    scheme: ParallelScheme
    a: float
    b: float
    c: float
    fwd_fraction: float
    capacity_tokens: int
    grad_bytes_per_gpu: float
    # Gradient bytes that take as long at the profile's sync bandwidth as this scheme's exposed
    # all-reduce (its own bytes, bus bandwidth and overlap); None: grad_bytes_per_gpu.
    grad_sync_equivalent_bytes: float | None = None

    @property
    def sync_bytes(self) -> float:
        """`grad_sync_equivalent_bytes`, or the gradient bytes when a profile gives no more."""
        return self.grad_bytes_per_gpu if self.grad_sync_equivalent_bytes is None else self.grad_sync_equivalent_bytes

    # With `scheme.v > 1`, a, b and c price one micro-batch on one PP rank: its v chunks.

    def stage_time_s(self, sum_sq_tokens: float, num_tokens: float) -> float:
        return self.a * sum_sq_tokens + self.b * num_tokens + self.c

    def micro_batch_time_s(self, lengths: np.ndarray) -> float:
        """Stage time of one micro-batch holding items of these lengths."""
        return self.stage_time_s(float(lengths @ lengths), float(lengths.sum()))

    def work_s(self, lengths: np.ndarray) -> np.ndarray:
        """Per-sequence share of stage time, without the per-micro-batch overhead c."""
        as_float = lengths.astype(np.float64)
        return self.a * as_float * as_float + self.b * as_float


def sync_equivalent_bytes(profile: CostProfile, entry: SchemeCost) -> float | None:
    """Bytes that take as long at the profile's sync bandwidth as the scheme's exposed all-reduce:
    its sync bytes scaled by profile bandwidth / scheme bandwidth and by the exposed share; None
    when the profile sets none of these (the gradient bytes then stand)."""
    own_bytes, own_bandwidth = entry.grad_sync_bytes_per_gpu, entry.grad_sync_bandwidth_bytes_per_s
    exposed = profile.grad_sync_exposed_fraction
    if own_bytes is None and own_bandwidth is None and exposed == 1.0:
        return None
    sync_bytes = entry.grad_bytes_per_gpu if own_bytes is None else own_bytes
    bandwidth = profile.grad_sync_bandwidth_bytes_per_s
    if own_bandwidth is not None and bandwidth is not None:
        sync_bytes *= bandwidth / own_bandwidth
    return sync_bytes * exposed


class ProfileCostModel:
    """`CostModel` over a `CostProfile`: converts units and derives capacities once."""

    def __init__(self, profile: CostProfile) -> None:
        self.profile = profile
        unit = profile.seconds_per_unit
        self._by_scheme: dict[ParallelScheme, SchemeCoefficients] = {}
        for entry in profile.schemes:
            scheme = entry.scheme
            # a v > 1 entry prices one chunk; the planner's stage time is a rank's v chunks
            per_rank = unit * scheme.v
            self._by_scheme[scheme] = SchemeCoefficients(
                scheme=scheme,
                a=entry.a * per_rank,
                b=entry.b * per_rank,
                c=entry.c * per_rank,
                fwd_fraction=entry.fwd_fraction,
                capacity_tokens=derive_capacity_tokens(profile, entry),
                grad_bytes_per_gpu=entry.grad_bytes_per_gpu,
                grad_sync_equivalent_bytes=sync_equivalent_bytes(profile, entry),
            )

    def schemes(self) -> list[ParallelScheme]:
        """The schemes the search enumerates: plain 1F1B ones (v = 1). A profile's interleaved
        entries are planned only where a strategy or pool names them (`knows`)."""
        return [scheme for scheme in self._by_scheme if scheme.v == 1]

    def all_schemes(self) -> list[ParallelScheme]:
        """Every scheme the profile prices, interleaved ones included."""
        return list(self._by_scheme)

    def knows(self, scheme: ParallelScheme) -> bool:
        return scheme in self._by_scheme

    def coefficients(self, scheme: ParallelScheme) -> SchemeCoefficients:
        try:
            return self._by_scheme[scheme]
        except KeyError:
            hint = (
                f" (an interleaved scheme needs its own entry with v {scheme.v}: per-chunk coefficients, e.g. "
                "from `hydraplan profile --virtual-stages`)"
                if scheme.v > 1
                else ""
            )
            raise ValueError(f"scheme {scheme} is not in the cost profile{hint}") from None

    def stage_time_s(self, scheme: ParallelScheme, lengths: Sequence[int]) -> float:
        coefficients = self.coefficients(scheme)
        as_float = np.asarray(lengths, dtype=np.float64)
        return coefficients.stage_time_s(float(as_float @ as_float), float(as_float.sum()))

    def fwd_fraction(self, scheme: ParallelScheme) -> float:
        return self.coefficients(scheme).fwd_fraction

    def capacity_tokens(self, scheme: ParallelScheme) -> int:
        return self.coefficients(scheme).capacity_tokens

    def grad_sync_s(self, pipeline_schemes: Sequence[ParallelScheme]) -> float:
        """Gradient synchronisation after the last micro-batch of the step.

        Every weight shard has one replica per CP rank of every pipeline; the replicas reduce their
        gradients with a ring all-reduce, `2(n-1)/n * bytes / bandwidth` (Patarasuk & Yuan 2009),
        over the slowest link. The slowest scheme's shard sets the time. A scheme's own sync bytes
        and bus bandwidth and the profile's exposed share (overlap with the backward pass) scale
        it (`sync_equivalent_bytes`). A profile may instead fix the time (`grad_sync_s`).
        """
        num_replicas = sum(scheme.cp for scheme in pipeline_schemes)
        return self.grad_sync_for_replicas_s(num_replicas, set(pipeline_schemes))

    def grad_sync_for_replicas_s(self, num_replicas: int, schemes: Collection[ParallelScheme]) -> float:
        """Gradient sync when each weight has `num_replicas` replicas over the given schemes."""
        if self.profile.grad_sync_s is not None:
            return self.profile.grad_sync_s * self.profile.seconds_per_unit
        bandwidth = self.profile.grad_sync_bandwidth_bytes_per_s
        if bandwidth is None or num_replicas <= 1:
            return 0.0
        ring_factor = 2 * (num_replicas - 1) / num_replicas
        largest_shard_bytes = max(self.coefficients(scheme).sync_bytes for scheme in schemes)
        return ring_factor * largest_shard_bytes / bandwidth
