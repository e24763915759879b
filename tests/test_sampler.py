"""The workload-balanced sampler for frameworks with a fixed layout: every sample exactly once per
epoch, steps of the asked size, balanced better than arrival-order packing, identical after a
restart from a step number, and clear refusals."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.integrations.torch import WorkloadBalancedSampler
from hydraplan.planner.baselines import arrival_order_micro_batches
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.simulate import simulate_1f1b

PROFILE = synthetic_profile(max_gpus=16)
LENGTHS = wikipedia_like_batch(400_000, seed=11, cap=12_000)


def sampler(**overrides) -> WorkloadBalancedSampler:
    options = {"dp_size": 4, "scheme": "<2,2,1>", "tokens_per_step": 100_000, "profile": PROFILE, "seed": 5}
    return WorkloadBalancedSampler(LENGTHS, **{**options, **overrides})


def test_every_sample_exactly_once_per_epoch() -> None:
    balanced = sampler()
    for epoch in (0, 1):
        seen = []
        for step in range(epoch * len(balanced), (epoch + 1) * len(balanced)):
            batches = balanced.step_batches(step)
            assert batches.epoch == epoch and len(batches.ranks) == 4
            assert all(batches.ranks[rank] for rank in range(4))  # no rank idle
            seen += [index for rank in batches.ranks for micro_batch in rank for index in micro_batch]
        assert sorted(seen) == list(range(len(LENGTHS)))
    first, second = balanced.step_samples(0)[1], balanced.step_samples(len(balanced))[1]
    assert not np.array_equal(first, second)  # each epoch draws its own order


def test_steps_hold_about_the_asked_tokens_and_fit_the_capacity() -> None:
    balanced = sampler()
    totals = [int(LENGTHS_ARRAY[balanced.step_samples(step)[1]].sum()) for step in range(len(balanced))]
    assert all(total >= 100_000 for total in totals[:-1])
    assert all(total < 100_000 + 12_000 for total in totals[:-1])
    for micro_batch in balanced.for_rank(2, 0, 3):
        assert sum(LENGTHS[i] for i in micro_batch) <= balanced.capacity_tokens


LENGTHS_ARRAY = np.asarray(LENGTHS)


def arrival_order_step_time_s(balanced: WorkloadBalancedSampler, step: int) -> float:
    """What the frameworks do by default: token packing in arrival order, dealt round-robin."""
    samples = balanced.step_samples(step)[1]
    coef = ProfileCostModel(balanced.profile).coefficients(balanced.scheme)
    batches = arrival_order_micro_batches(LENGTHS_ARRAY[samples], balanced.capacity_tokens)
    times = [coef.micro_batch_time_s(LENGTHS_ARRAY[samples][batch]) for batch in batches]
    return max(simulate_1f1b(times[rank :: balanced.dp_size], coef.scheme.pp, coef.fwd_fraction) for rank in range(4))


def test_balanced_steps_beat_arrival_order_packing() -> None:
    balanced = sampler()
    ratios = [
        arrival_order_step_time_s(balanced, step) / balanced.step_batches(step).predicted_step_time_s
        for step in range(3)
    ]
    assert min(ratios) >= 1.0 and float(np.mean(ratios)) > 1.05, ratios


def test_a_restart_from_a_step_number_gives_the_same_batches() -> None:
    first = [batches.ranks for batches in sampler().steps(0, 3)]
    restarted = [batches.ranks for batches in sampler().steps(1, 3)]
    assert restarted == first[1:]
    assert list(sampler().for_rank(1, 2, 3)) == [list(batch) for batch in first[2][1]]
    assert [b.ranks for b in sampler(seed=6).steps(0, 1)] != first[:1]


def test_refusals_name_the_value() -> None:
    capacity = ProfileCostModel(PROFILE).capacity_tokens(ParallelScheme(2, 2, 1))
    with pytest.raises(ValueError, match=rf"lengths\[1\] = {capacity + 1}: longer than the capacity of <2,2,1>"):
        WorkloadBalancedSampler([100, capacity + 1], dp_size=2, scheme="<2,2,1>", tokens_per_step=10, profile=PROFILE)
    with pytest.raises(ValueError, match="scheme <3,1,1> is not runnable"):
        sampler(scheme="<3,1,1>")
    with pytest.raises(ValueError, match="rank 4 is not in 0..3"):
        next(sampler().for_rank(4))
    with pytest.raises(ValueError, match="dp_size 0"):
        sampler(dp_size=0)


@pytest.mark.runtime
def test_the_torch_training_example_runs() -> None:
    """docs/examples/sampler_training.py: a plain torch loop on the sampler's batches trains."""
    pytest.importorskip("torch")
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "sampler_training.py"
    losses = runpy.run_path(str(example), run_name="example")["main"](num_steps=3)
    assert len(losses) == 3 and losses[-1] < losses[0]
