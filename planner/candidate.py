"""A complete solution inside the solver: strategy, assignment, packing, true objective."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydraplan.planner.cost import SchemeCoefficients
from hydraplan.planner.packing import PackedPipeline
from hydraplan.planner.strategies import Strategy


@dataclass(frozen=True)
class Candidate:
    """A complete solution: strategy, item assignment, packing and its true objective."""

    strategy: Strategy
    coefs: tuple[SchemeCoefficients, ...]  # one per pipeline, placement order
    assignment: tuple[np.ndarray, ...]  # item indices per pipeline
    packed: tuple[PackedPipeline, ...]
    grad_sync_s: float
    switch_cost_s: float = 0.0
    # where the solution came from: "search", or the name of the shipped baseline whose own plan
    # entered the search as a candidate (kept through the polish that improves it)
    origin: str = "search"

    @property
    def step_time_s(self) -> float:
        return max(pipeline.time_s for pipeline in self.packed) + self.grad_sync_s

    @property
    def objective_s(self) -> float:
        """What the search minimises: step time plus the cost of switching to this strategy."""
        return self.step_time_s + self.switch_cost_s
