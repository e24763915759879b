"""Workload-balanced batches for a framework that keeps its own homogeneous layout (Megatron-LM,
torchtitan, DeepSpeed, a plain torch loop): hydraplan's dispatch and packing for one fixed
strategy, `dp_size x <tp,pp,cp>`, the balancing WLB-LLM (Wang et al., OSDI 2025) sells.

`WorkloadBalancedSampler` draws each step's samples from a seeded permutation of the dataset
(every sample exactly once per epoch), cut into steps of about `tokens_per_step` tokens, and asks
the planner to pack them onto the data-parallel replicas under the scheme's capacity. For every
step it gives, per data-parallel rank, the micro-batches (lists of dataset indices) in execution
order. It is deterministic for a seed and resumable from a step number: step k's batches depend
only on (lengths, seed, k) and the cost source.

    sampler = WorkloadBalancedSampler(lengths, dp_size=8, scheme="<2,1,1>", tokens_per_step=2**20)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler.for_rank(rank), collate_fn=pack)

It needs no torch itself: a DataLoader takes any iterable of index lists as `batch_sampler`. The
micro-batch count may differ between ranks (a balanced plan gives a heavy rank fewer, fuller
micro-batches); frameworks that need one count for all ranks should run each rank's list as it
comes and synchronise gradients once per step, as 1F1B does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions, integer_list
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.solve import evaluate_strategy
from hydraplan.planner.strategies import Strategy

# Packing one step's samples onto a fixed strategy with the greedy backend takes well under a
# second for ~10^4 samples; this limit only keeps a pathological step from running away (a step
# that reaches it is still valid, only no longer guaranteed identical across runs).
STEP_TIME_LIMIT_S = 60.0


@dataclass(frozen=True)
class StepBatches:
    """One step's micro-batches: `ranks[r][k]` is micro-batch k (dataset indices) of rank r."""

    epoch: int
    step: int
    ranks: tuple[tuple[tuple[int, ...], ...], ...]
    predicted_step_time_s: float


class WorkloadBalancedSampler:
    """Per step and data-parallel rank, the micro-batches hydraplan packs for a fixed strategy."""

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        dp_size: int,
        scheme: str | tuple[int, int, int] = "<1,1,1>",
        tokens_per_step: int,
        model: str = "llama3-8b",
        gpu: str = "h100-sxm-80gb",
        profile: CostProfile | None = None,
        gpus_per_node: int = 8,
        seed: int = 0,
    ) -> None:
        self.lengths = np.asarray(integer_list(lengths), dtype=np.int64)
        if self.lengths.ndim != 1 or len(self.lengths) == 0 or self.lengths.min() < 1:
            raise ValueError("lengths: give at least one sample, every length >= 1")
        if dp_size < 1 or tokens_per_step < 1:
            raise ValueError(f"dp_size {dp_size} and tokens_per_step {tokens_per_step} must be >= 1")
        self.scheme = ParallelScheme.parse(scheme) if isinstance(scheme, str) else ParallelScheme(*scheme)
        self.dp_size = dp_size
        self.tokens_per_step = tokens_per_step
        self.seed = seed
        self.num_gpus = dp_size * self.scheme.num_gpus
        self.gpus_per_node = gpus_per_node
        self.profile = profile or build_profile(get_model(model), get_gpu(gpu), self.num_gpus, gpus_per_node)
        cost = ProfileCostModel(self.profile)
        if self.scheme not in cost.schemes():
            raise ValueError(f"scheme {self.scheme} is not runnable in the cost profile")
        self.capacity_tokens = cost.capacity_tokens(self.scheme)
        too_long = np.flatnonzero(self.lengths > self.capacity_tokens)
        if len(too_long):
            first = int(too_long[0])
            raise ValueError(
                f"lengths[{first}] = {int(self.lengths[first])}: longer than the capacity of {self.scheme}, "
                f"{self.capacity_tokens} tokens ({len(too_long)} such samples); cut them at the context length first"
            )

    # -- which samples a step holds -------------------------------------------------------------

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The dataset indices of an epoch in the order they are drawn (seeded by (seed, epoch))."""
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.lengths))

    @cached_property
    def steps_per_epoch(self) -> int:
        return len(self._step_starts(0)) - 1

    def _step_starts(self, epoch: int) -> np.ndarray:
        """Where each step of the epoch starts in its order: a step ends once it has
        `tokens_per_step` tokens and at least `dp_size` samples (the last takes what is left)."""
        order = self.epoch_order(epoch)
        cumulative = np.cumsum(self.lengths[order])
        starts = [0]
        while starts[-1] < len(order):
            begin = starts[-1]
            taken = cumulative[begin - 1] if begin else 0
            end = int(np.searchsorted(cumulative, taken + self.tokens_per_step, side="left")) + 1
            starts.append(min(len(order), max(end, begin + self.dp_size)))
        if len(starts) > 2 and starts[-1] - starts[-2] < self.dp_size:
            starts.pop(-2)  # a last step with fewer samples than ranks joins the one before it
        return np.asarray(starts)

    def step_samples(self, step: int) -> tuple[int, np.ndarray]:
        """(epoch, dataset indices) of global step `step` (counted from 0 over all epochs)."""
        if step < 0:
            raise ValueError(f"step {step} must be >= 0")
        epoch, index = divmod(step, self.steps_per_epoch)
        starts = self._step_starts(epoch)
        return epoch, self.epoch_order(epoch)[starts[index] : starts[index + 1]]

    # -- the micro-batches of a step --------------------------------------------------------------

    def step_plan(self, step: int) -> tuple[np.ndarray, Plan]:
        """The dataset indices of the step and hydraplan's checked plan of them."""
        _, samples = self.step_samples(step)
        request = PlanRequest(
            lengths=self.lengths[samples].tolist(),
            num_gpus=self.num_gpus,
            gpus_per_node=self.gpus_per_node,
            options=SolverOptions(solver="greedy", seed=self.seed, time_limit_s=STEP_TIME_LIMIT_S),
        )
        return samples, evaluate_strategy(request, self.profile, Strategy.of([(self.scheme, self.dp_size)]))

    def step_batches(self, step: int) -> StepBatches:
        epoch, _ = self.step_samples(step)
        samples, plan = self.step_plan(step)
        ranks = tuple(
            tuple(tuple(int(samples[i]) for i in batch.sequence_ids) for batch in pipeline.micro_batches)
            for pipeline in plan.pipelines
        )
        return StepBatches(epoch, step, ranks, plan.step_time_s)

    def __iter__(self) -> Iterator[StepBatches]:
        """Every step of the first epoch (use `steps(start)` to resume or run on)."""
        return self.steps(0, self.steps_per_epoch)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def steps(self, start: int = 0, stop: int | None = None) -> Iterator[StepBatches]:
        """Steps `start`, `start + 1`, ... (`stop` excluded; None: without end)."""
        step = start
        while stop is None or step < stop:
            yield self.step_batches(step)
            step += 1

    def for_rank(self, rank: int, start: int = 0, stop: int | None = None) -> Iterator[list[int]]:
        """A `batch_sampler` for one data-parallel rank: its micro-batches, step after step."""
        if not 0 <= rank < self.dp_size:
            raise ValueError(f"rank {rank} is not in 0..{self.dp_size - 1}")
        for batches in self.steps(start, self.steps_per_epoch if stop is None else stop):
            for micro_batch in batches.ranks[rank]:
                yield list(micro_batch)
