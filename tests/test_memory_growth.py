"""The floor on one long sequence's extrapolated memory growth (issue 31 item 4, held-out set 9):
beyond the grid a real-peak fit stays above the quadratic through the three longest measured single
sequences (`growth_floor`, at GROWTH_FLOOR_AT x the longest), where the upper fit alone may put the
long sequences' growth on a term that grows slower beyond the grid."""

from __future__ import annotations

import numpy as np
import pytest

from hydraplan.cost_models.fit import (
    GROWTH_FLOOR_AT,
    MEMORY_UNMETERED_MARGIN,
    fit_memory,
    growth_floor,
    memory_features,
    upper_fit,
)
from hydraplan.planner.measurements import StageSample

SHAPES = [
    shape for tokens in (128, 256, 512, 768) for shape in ([tokens], [32] * (tokens // 32), [tokens // 2] * 2)
] + [[1536]]


def trend(lengths: list[int]) -> float:
    return 3e6 + 1.07e5 * sum(lengths) + 77.0 * sum(x * x for x in lengths)


def samples(dip: float) -> list[StageSample]:
    """Real peaks on the trend, but the single sequences of 512 and 768 tokens `dip` below it: the
    measured single-sequence curve is steeper at its end than the trend an upper fit follows."""
    out = []
    for lengths in SHAPES:
        peak = trend(lengths) * (1 - dip if len(lengths) == 1 and lengths[0] in (512, 768) else 1)
        out.append(
            StageSample(
                tp=1, pp=1, lengths=lengths, time_s=1e-3 * sum(lengths), fwd_s=3e-4 * sum(lengths),
                peak_bytes=peak, static_bytes=5e6,
            )
        )  # fmt: skip
    return out


def unfloored(rows: list[StageSample]) -> np.ndarray:
    features = np.array([memory_features(s.lengths) for s in rows])
    return np.array(upper_fit(features, np.array([s.peak_bytes for s in rows])))


def test_the_floor_is_the_quadratic_through_the_three_longest_single_sequences() -> None:
    rows = samples(0.07)
    peaks = [s.peak_bytes for s in rows]
    features, values = growth_floor(rows, peaks)
    points = sorted((s.lengths[0], s.peak_bytes) for s in rows if len(s.lengths) == 1)[-3:]
    quadratic = np.polyfit([x for x, _ in points], [y for _, y in points], 2)
    lengths = [factor * 1536 for factor in GROWTH_FLOOR_AT]
    assert np.allclose(values, np.polyval(quadratic, lengths), rtol=1e-9)
    assert np.allclose(features, [memory_features([length]) for length in lengths])
    # a repeated length counts once, at its largest peak; fewer than three lengths give no floor
    again = rows + [rows[-1].model_copy(update={"peak_bytes": 2 * rows[-1].peak_bytes})]
    assert growth_floor(again, [s.peak_bytes for s in again])[1][0] > values[0]
    singles = [s for s in rows if len(s.lengths) == 1][:2]
    assert growth_floor(singles, [s.peak_bytes for s in singles]) is None


def test_the_fit_stays_above_the_floor_where_the_upper_fit_alone_falls_below() -> None:
    rows = samples(0.07)
    _, values = growth_floor(rows, [s.peak_bytes for s in rows])
    memory = fit_memory(rows)
    alone = unfloored(rows)
    for length, floor in zip((factor * 1536 for factor in GROWTH_FLOOR_AT), values, strict=True):
        assert memory.bytes([length]) >= floor * (1 + MEMORY_UNMETERED_MARGIN) * (1 - 1e-9)
    assert float(np.dot(alone, memory_features([2 * 1536]))) < 0.95 * values[0]  # the floor binds
    assert memory.coefficients[4] > 0  # through the 2.5th power term
    assert min(memory.residuals) >= MEMORY_UNMETERED_MARGIN - 1e-6  # every fitted row still covered


def test_the_floor_changes_nothing_where_single_sequences_follow_the_trend() -> None:
    rows = samples(0.0)
    memory = fit_memory(rows)
    expected = unfloored(rows) * memory.envelope * (1 + MEMORY_UNMETERED_MARGIN)
    assert np.allclose(memory.coefficients, expected, rtol=1e-6, atol=1e-6)
    assert memory.bytes([3072]) == pytest.approx(trend([3072]) * (1 + MEMORY_UNMETERED_MARGIN), rel=1e-6)
