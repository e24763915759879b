"""Per-rank slowdown factors from a session's measurements (issue 31, item 3: a slow node).

The per-scheme refit (`cost_models.online_fit`) cannot see a slow rank: pipelines of one scheme
share one fit. What can: each measured pipeline's ratio of measured to predicted stage time (over
its measured micro-batches), with its ranks. The estimate, with its stated constants:

- **relative to the step's fastest pipeline.** A step with at least two measured pipelines gives
  each of them `ratio / min(ratios of the step)`, where a ratio is taken against the *unscaled*
  prediction (a plan that already slowed a pipeline by f predicted f times the profile's time: its
  ratio is multiplied back by f). A drift of the whole machine moves every ratio alike and is the
  refit's business, not a slow rank; a step of one pipeline shows no contrast and adds nothing;
- **within a pipeline, the ranks of one PP stage** (its TP x CP group: equal work) are told apart by
  their compute CPU time over the step (`rank_compute_s`, where the body gives it): the group's
  slowest rank carries the pipeline's observation and the others theirs scaled by their compute over
  its. With each rank's expected work too (`rank_work`: its stage's forward FLOPs over its TP x CP
  ranks, the last stage's LM head included), every rank of the pipeline is compared by compute
  over work, across PP stages too. A step of one pipeline then shows a contrast (the closed-loop
  run on an Intel host planned one `<1,2,1>` pipeline on most steps after a slowdown and never
  saw it). Where the compute is not given, every rank of the pipeline gets the pipeline's
  observation (the body names the pipeline's ranks, not which of them was slow);
- a rank's factor is the **median of its last `MIN_OBSERVATIONS`**
  observations within the last `WINDOW_STEPS` steps: one straggler step or one outlier pipeline
  moves no median, two in a row (a new regime) do, and an older regime does not hold the estimate
  back (a median over the whole window took 6 steps to see a 3x slowdown in the closed-loop run);
- **evidence before acting**: a rank needs at least `MIN_OBSERVATIONS` observations, and a median
  of at least `MIN_FACTOR` (two pipelines of one scheme differ by up to 27% on the loaded 2-core
  CPU of benchmarks/results/closed_loop.md with no slowdown at all) before it is called slow;
- **only slowdowns, clipped**: factors are >= 1 (a rank faster than the fastest pipeline is not
  a thing the relative ratio can show) and at most `MAX_FACTOR`.

Pure Python; the session and the local planner keep the observations in `OnlineFitState`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_FACTOR",
    "MIN_FACTOR",
    "MIN_OBSERVATIONS",
    "WINDOW_STEPS",
    "PipelineRatio",
    "rank_factors",
    "step_observations",
]

WINDOW_STEPS = 8  # observations of the last 8 steps count
MIN_OBSERVATIONS = 3  # a rank's factor: the median of its last 3 observations (3 needed) ...
MIN_FACTOR = 1.5  # ... when it is 50% or more over the step's fastest pipeline
MAX_FACTOR = 8.0  # a factor is clipped to at most 8


@dataclass(frozen=True)
class PipelineRatio:
    """One measured pipeline of a step: its ranks, the sum of its measured micro-batches' times,
    the plan's prediction of the same micro-batches and the slowdown factor that prediction held;
    where known, each rank's compute CPU time over the step (`ranks` order) and the ranks per PP
    stage (`stage_size`: tp x cp, stage-major `ranks`)."""

    ranks: tuple[int, ...]
    measured_s: float
    predicted_s: float
    slowdown: float = 1.0
    rank_compute_s: tuple[float, ...] = ()
    stage_size: int = 1
    rank_work: tuple[float, ...] = ()

    @property
    def unscaled_ratio(self) -> float:
        """Measured over the profile's own prediction (the plan's slowdown factor taken out)."""
        return self.measured_s / self.predicted_s * self.slowdown

    def within(self) -> dict[int, float]:
        """Rank -> how much slower it computes than the pipeline's fastest comparable rank (>= 1):
        with each rank's expected work, its compute over its work against the least such over
        every rank of the pipeline; without it, its compute against the least of its own PP
        stage's ranks (equal work); 1 for every rank where the compute is not known for every
        rank (or not positive)."""
        computes = self.rank_compute_s
        if len(computes) != len(self.ranks) or self.stage_size < 1 or min(computes, default=0.0) <= 0:
            return dict.fromkeys(self.ranks, 1.0)
        if len(self.rank_work) == len(self.ranks) and min(self.rank_work) > 0:
            speeds = [compute / work for compute, work in zip(computes, self.rank_work, strict=True)]
            least = min(speeds)
            return {rank: speed / least for rank, speed in zip(self.ranks, speeds, strict=True)}
        within = {}
        for start in range(0, len(self.ranks), self.stage_size):
            group = range(start, min(start + self.stage_size, len(self.ranks)))
            least = min(computes[index] for index in group)
            within.update({self.ranks[index]: computes[index] / least for index in group})
        return within

    @property
    def has_contrast(self) -> bool:
        """Whether its own ranks can be told apart: compute known for its ranks and either their
        expected work or a stage of two ranks or more."""
        if len(self.rank_compute_s) != len(self.ranks) or len(self.ranks) < 2:
            return False
        return self.stage_size >= 2 or len(self.rank_work) == len(self.ranks)


def step_observations(step: int, pipelines: Sequence[PipelineRatio]) -> list[tuple[int, int, float]]:
    """(step, rank, ratio over the step's fastest) for every rank of every pipeline: across
    pipelines, a pipeline's ratio over the fastest pipeline's, carried by its slowest rank, the
    others' scaled by their compute over that rank's (`PipelineRatio.within`). With one pipeline,
    its ranks' compute contrast alone (none where its stages have one rank each, or the compute is
    not given)."""
    usable = [pipeline for pipeline in pipelines if pipeline.measured_s > 0 and pipeline.predicted_s > 0]
    if len(usable) < 2:
        return [
            (step, rank, ratio)
            for pipeline in usable
            if pipeline.has_contrast
            for rank, ratio in sorted(pipeline.within().items())
        ]
    fastest = min(pipeline.unscaled_ratio for pipeline in usable)
    observations = []
    for pipeline in usable:
        within = pipeline.within()
        top = max(within.values())
        ratio = pipeline.unscaled_ratio / fastest
        observations += [(step, rank, ratio * within[rank] / top) for rank in sorted(within)]
    return observations


def rank_factors(observations: Iterable[tuple[int, int, float]], now_step: int) -> dict[int, float]:
    """Rank -> slowdown factor (> 1 only) from the observations of the last `WINDOW_STEPS` steps:
    the median of a rank's last `MIN_OBSERVATIONS` (by step), when it has that many and the median
    is at least `MIN_FACTOR`; clipped to `MAX_FACTOR`."""
    by_rank: dict[int, list[tuple[int, float]]] = {}
    for step, rank, ratio in observations:
        if step > now_step - WINDOW_STEPS:
            by_rank.setdefault(rank, []).append((step, ratio))
    factors = {}
    for rank in sorted(by_rank):
        recent = sorted(by_rank[rank], key=lambda observation: observation[0])[-MIN_OBSERVATIONS:]
        if len(recent) < MIN_OBSERVATIONS:
            continue
        median = statistics.median(ratio for _, ratio in recent)
        if median >= MIN_FACTOR:
            factors[rank] = min(median, MAX_FACTOR)
    return factors


def kept_observations(observations: Iterable[tuple[int, int, float]], now_step: int) -> list[tuple[int, int, float]]:
    """The observations still inside the window at `now_step` (what a state keeps)."""
    return [observation for observation in observations if observation[0] > now_step - WINDOW_STEPS]
