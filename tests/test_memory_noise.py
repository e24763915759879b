"""The real-peak memory fit's margin from the step noise (issue 31 item 4, set 5): the fit follows
each micro-batch's median step peak, the margin is the largest excess of a fitted micro-batch's
largest step peak over its median (at least MEMORY_SAFETY_MARGIN), so every fitted largest peak is
covered and one noisy step lifts the margin, not the trend."""

from __future__ import annotations

import numpy as np
import pytest

from hydraplan.cost_models.fit import MEMORY_SAFETY_MARGIN, fit_memory, fit_stage, memory_noise, upper_fit
from hydraplan.planner.measurements import StageSample

SHAPES = [[256], [512], [768], [128, 128], [256, 256], [384, 384], [32] * 8, [32] * 16, [400, 32, 32, 32, 32]]


def trend(lengths: list[int]) -> float:
    return 4e6 + 2e4 * sum(lengths) + 30.0 * sum(x * x for x in lengths) + 60.0 * max(lengths) ** 2


def samples_with_noise(noise: list[float], wobble: float = 0.02, seed: int = 3) -> list[StageSample]:
    """Medians within `wobble` of the trend; each largest peak `noise[i]` above its median."""
    rng = np.random.default_rng(seed)
    samples = []
    for lengths, excess in zip(SHAPES, noise, strict=True):
        median = trend(lengths) * (1 + wobble * rng.uniform(-1, 1))
        samples.append(
            StageSample(
                tp=1, pp=1, lengths=lengths, mix="x", time_s=1e-3 * sum(lengths), fwd_s=3e-4 * sum(lengths),
                activation_bytes=median / 2, peak_bytes=median * (1 + excess), peak_median_bytes=median,
                static_bytes=1e6,
            )
        )  # fmt: skip
    return samples


def features(samples: list[StageSample]) -> np.ndarray:
    return np.array([[1.0, s.num_tokens, s.sum_sq_tokens, max(s.lengths) ** 2] for s in samples])


def test_the_margin_is_the_largest_step_noise_and_covers_every_fitted_largest_peak() -> None:
    noise = [0.03, 0.08, 0.18, 0.02, 0.05, 0.11, 0.01, 0.04, 0.06]
    samples = samples_with_noise(noise)
    assert memory_noise(samples) == pytest.approx(0.18)
    memory = fit_memory(samples)
    assert memory.fitted_to == "real_peak" and memory.margin == pytest.approx(0.18)
    # residuals are against the largest peak, and none is under
    for sample, residual in zip(samples, memory.residuals, strict=True):
        assert residual == pytest.approx((memory.bytes(sample.lengths) - sample.peak_bytes) / sample.peak_bytes)
        assert residual >= -1e-9
    # the trend is the tightest upper fit to the medians, lifted by its envelope and the margin
    medians = np.array([s.peak_median_bytes for s in samples])
    solution = np.array(upper_fit(features(samples), medians))
    expected = solution * memory.envelope * 1.18
    assert np.allclose(memory.coefficients, expected, rtol=1e-9, atol=1e-12)
    assert min(features(samples) @ solution / medians) == pytest.approx(1.0, abs=1e-6)  # tight on one median


def test_quiet_steps_keep_the_stated_smallest_margin() -> None:
    memory = fit_memory(samples_with_noise([0.01] * len(SHAPES)))
    assert memory.margin == MEMORY_SAFETY_MARGIN and min(memory.residuals) >= -1e-9


def test_one_noisy_step_lifts_the_margin_not_the_trend() -> None:
    quiet = [0.02] * len(SHAPES)
    spiky = quiet.copy()
    spiky[4] = 0.25  # one micro-batch had one step 25% above its median
    calm, noisy = fit_memory(samples_with_noise(quiet)), fit_memory(samples_with_noise(spiky))
    assert noisy.margin == pytest.approx(0.25)
    # the same trend (fitted to the same medians), only the scale differs
    ratio = np.array(noisy.coefficients) / np.array(calm.coefficients)
    nonzero = np.array(calm.coefficients) > 0
    assert np.allclose(ratio[nonzero], 1.25 / (1 + MEMORY_SAFETY_MARGIN))
    # the older rule, an upper fit to the largest peaks, lets that one step bend the trend
    largest = np.array([s.peak_bytes for s in samples_with_noise(spiky)])
    bent = np.array(upper_fit(features(samples_with_noise(spiky)), largest))
    assert not np.allclose(bent[nonzero] / np.array(calm.coefficients)[nonzero], ratio[nonzero][0], rtol=1e-3)


def test_samples_without_medians_keep_the_older_rule() -> None:
    samples = [s.model_copy(update={"peak_median_bytes": None}) for s in samples_with_noise([0.2] * len(SHAPES))]
    memory = fit_memory(samples)
    assert memory.margin == MEMORY_SAFETY_MARGIN and memory_noise(samples) == 0.0
    assert min(memory.residuals) == pytest.approx(MEMORY_SAFETY_MARGIN, abs=1e-6)  # tight on the largest peaks


def test_the_stage_fit_records_the_margin_it_used() -> None:
    fit = fit_stage(samples_with_noise([0.03, 0.08, 0.12, 0.02, 0.05, 0.11, 0.01, 0.04, 0.06]))
    assert fit.memory_fitted_to == "real_peak" and fit.memory_margin == pytest.approx(0.12)
