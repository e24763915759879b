"""The online refit of a session's profile (cost_models/online_fit.py): robust, recent, capped,
blended with the prior, versioned; capacity lowering on measured peaks; error jumps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from hydraplan.cost_models import online_fit
from hydraplan.cost_models.online_fit import (
    MAX_STEP_CHANGE,
    MeasuredMicroBatch,
    MeasuredPipeline,
    OnlineFitState,
    apply_step,
    coefficients_at,
    is_error_jump,
    lowered_capacity,
    profile_at,
)
from hydraplan.cost_models.profile_io import load_profile
from hydraplan.planner.schemas import LONGEST_POWER, CostProfile, derive_capacity_tokens

PROFILE_PATH = "cost_models/data/tiny-cpu.json"
SCHEME = (1, 2, 1)


@pytest.fixture(name="true_profile")
def true_profile_fixture() -> CostProfile:
    return load_profile(Path(__file__).resolve().parents[1] / PROFILE_PATH)


def scaled(profile: CostProfile, a_factor: float, b_factor: float) -> CostProfile:
    """The deliberately wrong start of issue 31: quadratic and linear terms scaled."""
    schemes = [entry.model_copy(update={"a": entry.a * a_factor, "b": entry.b * b_factor}) for entry in profile.schemes]
    return profile.model_copy(update={"schemes": schemes})


def step_of(
    profile: CostProfile, step: int, *, slow: float = 1.0, noise: float = 0.03, peak: float | None = None
) -> list[MeasuredPipeline]:
    """Eight micro-batches of varied lengths timed by the true `profile` (deterministic noise)."""
    entry = next(entry for entry in profile.schemes if entry.key == SCHEME)
    rng = np.random.default_rng(step)
    micro_batches = []
    for _ in range(8):
        lengths = rng.integers(32, 2048, size=int(rng.integers(1, 6)))
        s2, s1 = float((lengths.astype(float) ** 2).sum()), float(lengths.sum())
        time_s = (entry.a * s2 + entry.b * s1 + entry.c) * slow * (1 + rng.uniform(-noise, noise))
        micro_batches.append(MeasuredMicroBatch(sum_sq_tokens=s2, num_tokens=s1, time_s=time_s, fwd_s=time_s / 3))
    return [MeasuredPipeline(scheme=SCHEME, micro_batches=tuple(micro_batches), peak_bytes=peak)]


def current_window(state: OnlineFitState) -> online_fit.SchemeWindow:
    window = state.window(SCHEME)
    assert window is not None
    return window


def current(state: OnlineFitState) -> online_fit.Coefficients:
    window = state.window(SCHEME)
    assert window is not None
    return window.current


def test_a_wrong_profile_converges_within_ten_steps(true_profile) -> None:
    """Quadratic x2 and linear x0.5 (issue 31's wrong start): each step is scored against the version
    that planned it, and the median error is <= 10% within 10 posted steps."""
    wrong = scaled(true_profile, 2.0, 0.5)
    state = OnlineFitState()
    for step in range(1, 11):
        state = apply_step(state, wrong, step_of(true_profile, step), state.version)
    errors = [error.median_error for error in state.errors]
    assert errors[0] > 0.2, errors  # the start is wrong indeed
    assert errors[-1] <= 0.10, errors
    assert state.version == 10
    assert [error.profile_version for error in state.errors] == list(range(10))


def test_an_outlier_step_moves_each_coefficient_by_at_most_the_cap(true_profile) -> None:
    state = OnlineFitState()
    for step in range(1, 7):
        state = apply_step(state, true_profile, step_of(true_profile, step), state.version)
    before = current(state)
    straggler = apply_step(state, true_profile, step_of(true_profile, 7, slow=5.0), state.version)
    after = current(straggler)
    for name in ("a", "b", "c"):
        old, new = getattr(before, name), getattr(after, name)
        assert abs(new - old) <= MAX_STEP_CHANGE * old * (1 + 1e-9), (name, old, new)
    # robust, not only capped: the prediction of a typical micro-batch barely moves
    s2, s1 = 4 * 1000.0**2, 4 * 1000.0
    assert after.stage_time_s(s2, s1) / before.stage_time_s(s2, s1) < 1.05


def test_the_first_step_is_capped_too(true_profile) -> None:
    wrong = scaled(true_profile, 10.0, 10.0)
    state = apply_step(OnlineFitState(), wrong, step_of(true_profile, 1), 0)
    entry = next(entry for entry in wrong.schemes if entry.key == SCHEME)
    fitted = current(state)
    assert fitted.a == pytest.approx(entry.a * (1 - MAX_STEP_CHANGE))
    assert fitted.b == pytest.approx(entry.b * (1 - MAX_STEP_CHANGE))


def test_a_lasting_slowdown_is_followed_and_reported(true_profile) -> None:
    """A slow node that stays slow: the error jump is reported from its first step on; a second jump
    in a row restarts the window from the first slow step, and the fit follows within four steps."""
    state = OnlineFitState()
    for step in range(1, 7):
        state = apply_step(state, true_profile, step_of(true_profile, step), state.version)
    assert state.drift == []
    for step in range(7, 20):
        state = apply_step(state, true_profile, step_of(true_profile, step, slow=1.6), state.version)
        if step == 8:
            assert {row[0] for row in current_window(state).rows} == {7, 8}  # the old regime is dropped
    assert state.drift[0].step == 7 and state.drift[0].median_error > 0.3
    errors = [error.median_error for error in state.errors]
    assert max(errors[9:]) <= 0.10, errors  # from step 10 on


def test_a_uniform_slowdown_scales_every_term_alike(true_profile) -> None:
    """A node slowed 1.6x on every term: the ridge towards the prior's shape at the data's level
    lets the fit follow as a whole, instead of pulling the heavy terms back and letting the light
    one (`c`, near 0 in the bundled profile) absorb the rest."""
    entry = next(entry for entry in true_profile.schemes if entry.key == SCHEME)
    state = OnlineFitState()
    for step in range(1, 7):
        state = apply_step(state, true_profile, step_of(true_profile, step), state.version)
    for step in range(7, 13):
        state = apply_step(state, true_profile, step_of(true_profile, step, slow=1.6), state.version)
    fitted = current(state)
    assert fitted.a / entry.a == pytest.approx(1.6, rel=0.02)
    assert fitted.b / entry.b == pytest.approx(1.6, rel=0.02)
    assert state.errors[-1].median_error <= 0.03


def test_a_wrong_start_is_close_by_the_third_step(true_profile) -> None:
    """Issue 31's wrong start (a x2, b x0.5): the ridge towards the prior's shape at the data's
    level gets the third step's prediction within 10% (12% with the ridge towards the unscaled
    prior). The coefficients themselves stay off (a ~1.3x, b ~0.5x, c absorbing the rest): the
    sampled lengths do not tell the terms apart well, so this asserts the error, not the terms."""
    wrong = scaled(true_profile, 2.0, 0.5)
    state = OnlineFitState()
    for step in (1, 2, 3):
        state = apply_step(state, wrong, step_of(true_profile, step, noise=0.05), state.version)
    assert state.errors[0].median_error > 0.4  # the start is wrong
    assert state.errors[-1].median_error <= 0.10


def test_a_straggler_step_does_not_restart_the_window(true_profile) -> None:
    state = OnlineFitState()
    for step in range(1, 7):
        state = apply_step(state, true_profile, step_of(true_profile, step), state.version)
    state = apply_step(state, true_profile, step_of(true_profile, 7, slow=3.0), state.version)
    state = apply_step(state, true_profile, step_of(true_profile, 8), state.version)
    assert [event.step for event in state.drift] == [7]
    assert {row[0] for row in current_window(state).rows} == set(range(1, 9))


def test_profile_at_applies_the_fit_and_prices_other_schemes_at_the_shared_scales(true_profile) -> None:
    wrong = scaled(true_profile, 2.0, 0.5)
    state = apply_step(OnlineFitState(), wrong, step_of(true_profile, 1), 0)
    refitted = profile_at(state, wrong)
    CostProfile.model_validate(refitted.model_dump())  # still a valid profile
    by_key = {entry.key: entry for entry in refitted.schemes}
    assert by_key[SCHEME].a == pytest.approx(current(state).a)
    scale_a, scale_b, scale_c = state.shared
    assert scale_a < 1.0 < scale_b  # the measured scheme shows the profile's a too high, b too low
    others = [entry for entry in wrong.schemes if entry.key != SCHEME]
    for entry in others:  # no window: the prior at the shared scales, everything else kept
        moved = by_key[entry.key]
        assert (moved.a, moved.b, moved.c) == pytest.approx((entry.a * scale_a, entry.b * scale_b, entry.c * scale_c))
        assert moved.model_copy(update={"a": entry.a, "b": entry.b, "c": entry.c}) == entry
    assert profile_at(OnlineFitState(), wrong) is wrong


def fresh_median_error(fitted: CostProfile, truth: CostProfile, key: tuple[int, ...]) -> float:
    """Median relative error of `fitted`'s stage times for `key` against `truth`'s on 200 mixes of
    1-4 log-uniform lengths of 16-768 tokens that no step measured."""
    entry = next(entry for entry in fitted.schemes if entry.key == key)
    true = next(entry for entry in truth.schemes if entry.key == key)
    rng = np.random.default_rng(999)
    errors = []
    for _ in range(200):
        lengths = np.exp(rng.uniform(np.log(16), np.log(768), size=int(rng.integers(1, 5)))).astype(int)
        s2, s1 = float((lengths.astype(float) ** 2).sum()), float(lengths.sum())
        truth_s = true.a * s2 + true.b * s1 + true.c
        errors.append(abs(entry.a * s2 + entry.b * s1 + entry.c - truth_s) / truth_s)
    return float(np.median(errors))


def measured_step(truth: CostProfile, keys: list[tuple[int, ...]], step: int) -> list[MeasuredPipeline]:
    """One pipeline per scheme in `keys`, 2-5 micro-batches of 1-4 log-uniform lengths each, timed by
    `truth` with 5% noise (deterministic)."""
    rng = np.random.default_rng(1000 + step)
    pipelines = []
    for key in keys:
        entry = next(entry for entry in truth.schemes if entry.key == key)
        micro_batches = []
        for _ in range(int(rng.integers(2, 6))):
            lengths = np.exp(rng.uniform(np.log(16), np.log(768), size=int(rng.integers(1, 5)))).astype(int)
            s2, s1 = float((lengths.astype(float) ** 2).sum()), float(lengths.sum())
            time_s = (entry.a * s2 + entry.b * s1 + entry.c) * (1 + rng.uniform(-0.05, 0.05))
            micro_batches.append(MeasuredMicroBatch(s2, s1, time_s, time_s / 3))
        pipelines.append(MeasuredPipeline(scheme=key, micro_batches=tuple(micro_batches)))
    return pipelines


def test_a_scheme_never_measured_is_corrected_by_the_shared_scales(true_profile) -> None:
    """The wrong start, only `<1,2,1>` measured for 12 steps: `<1,1,2>` was never measured, yet the
    profile prices it within 5% of the truth on mixes no step had (0.7% when written; the wrong
    start itself, which it kept before the shared scales: 35%)."""
    wrong = scaled(true_profile, 2.0, 0.5)
    other = (1, 1, 2)
    state = OnlineFitState()
    for step in range(1, 13):
        state = apply_step(state, wrong, measured_step(true_profile, [SCHEME], step), state.version)
    assert state.window(other) is None
    assert fresh_median_error(wrong, true_profile, other) > 0.3
    assert fresh_median_error(profile_at(state, wrong), true_profile, other) < 0.05


def test_a_rarely_measured_scheme_borrows_the_shape_the_others_show(true_profile) -> None:
    """`<1,1,2>` measured on two early steps, `<1,2,1>` on every step: the rare scheme's few
    micro-batches cannot tell its terms apart; with its ridge towards the shape every scheme's data
    shows, both are priced within 5% on new mixes (2.5% and 0.8% when written; 8.6% and 9.4% when
    each scheme's ridge pulled towards its own wrong prior's shape)."""
    wrong = scaled(true_profile, 2.0, 0.5)
    rare = (1, 1, 2)
    state = OnlineFitState()
    for step in range(1, 15):
        keys = [SCHEME, rare] if step in (2, 3) else [SCHEME]
        state = apply_step(state, wrong, measured_step(true_profile, keys, step), state.version)
    assert state.window(rare) is not None
    assert fresh_median_error(profile_at(state, wrong), true_profile, rare) < 0.05
    assert fresh_median_error(profile_at(state, wrong), true_profile, SCHEME) < 0.05


def test_a_step_is_scored_against_the_shared_scales_of_its_version(true_profile) -> None:
    wrong = scaled(true_profile, 2.0, 0.5)
    state = apply_step(OnlineFitState(), wrong, step_of(true_profile, 1), 0)
    other = (1, 1, 2)
    at_one = online_fit.coefficients_at(state, wrong, 1)[other]
    prior = online_fit.prior_coefficients(wrong, next(e for e in wrong.schemes if e.key == other))
    assert (at_one.a, at_one.b, at_one.c) == pytest.approx(
        (prior.a * state.shared[0], prior.b * state.shared[1], prior.c * state.shared[2])
    )
    assert online_fit.coefficients_at(state, wrong, 0)[other] == prior
    later = apply_step(state, wrong, step_of(true_profile, 2), 1)
    assert later.shared != state.shared  # the scales moved on, yet version 1 still prices as it did
    assert online_fit.coefficients_at(later, wrong, 1)[other] == at_one


def test_an_outlier_step_moves_the_shared_scales_by_at_most_the_cap(true_profile) -> None:
    state = OnlineFitState()
    for step in range(1, 7):
        state = apply_step(state, true_profile, step_of(true_profile, step), state.version)
    before = state.shared
    state = apply_step(state, true_profile, step_of(true_profile, 7, slow=50.0), state.version)
    for old, new in zip(before, state.shared):
        assert abs(new - old) <= MAX_STEP_CHANGE * old * (1 + 1e-9)


def test_versions_are_kept_to_score_a_step(true_profile) -> None:
    state = OnlineFitState()
    for step in range(1, 4):
        state = apply_step(state, true_profile, step_of(true_profile, step), state.version)
    assert coefficients_at(state, true_profile, 2)[SCHEME] == state.snapshots[1][1][0]
    with pytest.raises(ValueError, match="newer"):
        coefficients_at(state, true_profile, 4)
    with pytest.raises(ValueError, match="not in the session's profile"):
        apply_step(state, true_profile, [MeasuredPipeline((8, 8, 8), ())], 0)


def test_lowered_capacity_rules() -> None:
    usable = 100e9
    assert lowered_capacity(10_000, 50e9, usable, 60e9) is None  # far below both
    tokens, reason, limit = lowered_capacity(10_000, 97e9, usable, None)
    assert reason == "near-device-memory" and limit == usable
    assert tokens == int(10_000 * 0.90 * usable / 97e9)
    tokens, reason, limit = lowered_capacity(10_000, 60e9, usable, 48e9)
    assert (tokens, reason, limit) == (8_000, "above-predicted-peak", 48e9)
    # both: the lower capacity wins
    tokens, reason, _ = lowered_capacity(10_000, 99e9, usable, 50e9)
    assert reason == "above-predicted-peak" and tokens == int(10_000 * 50 / 99)


def test_a_measured_peak_lowers_the_capacity_at_once(true_profile) -> None:
    """Near device memory: a profile without a memory model (no predicted peak), only capacities."""
    no_model = {"static_bytes": None, "activation_bytes_per_token": None}
    true_profile = true_profile.model_copy(
        update={"schemes": [entry.model_copy(update=no_model) for entry in true_profile.schemes]}
    )
    usable = true_profile.gpu_memory_bytes - true_profile.memory_reserve_bytes
    entry = next(entry for entry in true_profile.schemes if entry.key == SCHEME)
    state = apply_step(OnlineFitState(), true_profile, step_of(true_profile, 1, peak=0.97 * usable), 0)
    assert state.version == 1
    (change,) = state.capacity_changes
    assert change.scheme == "<1,2,1>" and change.reason == "near-device-memory"
    assert change.from_tokens == entry.capacity_tokens
    assert change.to_tokens == int(entry.capacity_tokens * 0.90 / 0.97)
    lowered = {scheme.key: scheme for scheme in profile_at(state, true_profile).schemes}[SCHEME]
    assert lowered.capacity_tokens == change.to_tokens
    # the same peak again lowers it again (from the lowered value), never raises it
    again = apply_step(state, true_profile, step_of(true_profile, 2, peak=0.97 * usable), 1)
    assert again.capacity_changes[-1].from_tokens == change.to_tokens
    assert again.capacity_changes[-1].to_tokens < change.to_tokens


def test_a_peak_above_the_prediction_lowers_the_capacity(true_profile) -> None:
    pipelines = step_of(true_profile, 1)
    entry = next(entry for entry in true_profile.schemes if entry.key == SCHEME)
    predicted = online_fit.predicted_peak_bytes(entry, pipelines[0].micro_batches)
    assert predicted is not None
    measured = [MeasuredPipeline(SCHEME, pipelines[0].micro_batches, peak_bytes=predicted * 1.25)]
    state = apply_step(OnlineFitState(), true_profile, measured, 0)
    (change,) = state.capacity_changes
    assert change.reason == "above-predicted-peak" and change.limit_bytes == predicted
    # the excess is the activations' (they are most of this prediction): the model's activation
    # bytes x measured / predicted activations x 1.05, and the capacity the corrected model derives
    scale = (1.25 * predicted - entry.static_bytes) / (predicted - entry.static_bytes) * 1.05
    expected = derive_capacity_tokens(true_profile, corrected_entry(entry, scale))
    assert change.to_tokens == expected < entry.capacity_tokens
    assert state.window(SCHEME).activation_scale == pytest.approx(scale)


def corrected_entry(entry, scale: float, extra_static_bytes: float = 0.0):
    """The entry's memory model as a correction should leave it, worked out here: every activation
    term x `scale`, `extra_static_bytes` on the static ones, the capacity left to be derived."""
    terms = (
        "activation_bytes_per_token",
        "activation_bytes_per_token_sq",
        "activation_bytes_per_longest_sq",
        "activation_bytes_per_longest_pow",
    )
    update = {term: getattr(entry, term) * scale for term in terms}
    update.update(static_bytes=entry.static_bytes + extra_static_bytes, capacity_tokens=None)
    return entry.model_copy(update=update)


def one_sequence(tokens: int) -> MeasuredMicroBatch:
    return MeasuredMicroBatch(sum_sq_tokens=float(tokens) ** 2, num_tokens=float(tokens), time_s=0.1)


def test_a_lasting_under_prediction_lowers_the_capacity_once_not_every_step(true_profile) -> None:
    """The activations are twice what the profile says, step after step. The first peak, over the
    device's memory, lowers the capacity at once (by the lower of the near-device cut and the
    corrected model's capacity); later micro-batches within it peak under the corrected
    prediction, so the capacity stays (the rule that scaled the current capacity by predicted /
    peak cut it again at every step: 12,935 -> 5,825 -> 2,922 -> 1,478 -> 766 -> 419), and a full
    micro-batch at it fits the device."""
    usable = true_profile.gpu_memory_bytes - true_profile.memory_reserve_bytes
    entry = next(entry for entry in true_profile.schemes if entry.key == SCHEME)
    in_flight = entry.in_flight_micro_batches

    def true_peak(tokens: int) -> float:
        per_square = entry.activation_bytes_per_token_sq + entry.activation_bytes_per_longest_sq
        return entry.static_bytes + 2.0 * in_flight * (
            entry.activation_bytes_per_token * tokens
            + per_square * tokens**2
            + entry.activation_bytes_per_longest_pow * tokens**LONGEST_POWER
        )

    state, capacities = OnlineFitState(), []
    for _ in range(5):
        capacity = (state.window(SCHEME).capacity_tokens if state.window(SCHEME) else None) or entry.capacity_tokens
        sizes = [capacity // 2, capacity * 3 // 4, capacity]  # micro-batches up to the capacity the plan had
        micro_batches = tuple(one_sequence(size) for size in sizes)
        measured = [MeasuredPipeline(SCHEME, micro_batches, peak_bytes=true_peak(max(sizes)))]
        state = apply_step(state, true_profile, measured, state.version)
        capacities.append(state.window(SCHEME).capacity_tokens)
    assert capacities[0] < entry.capacity_tokens
    assert capacities == [capacities[0]] * 5
    assert true_peak(capacities[0]) <= usable


def test_a_peak_over_a_small_micro_batch_moves_the_static_bytes_not_the_activations(true_profile) -> None:
    """Two peaks: a large micro-batch's as the model predicts, a small one's 100 MB above it (the
    allocator's, not the activations'). The correction keeps the activations at the model's (x1.05)
    and adds the 100 MB to the static bytes; scaling the activations by the small peak's ratio
    (x114 with the margin, here) cut the capacity from 12,935 tokens to 888."""
    entry = next(entry for entry in true_profile.schemes if entry.key == SCHEME)
    small, large = (one_sequence(16),), (one_sequence(4096),)
    small_peak = online_fit.predicted_peak_bytes(entry, small) + 1e8
    large_peak = online_fit.predicted_peak_bytes(entry, large)
    measured = [
        MeasuredPipeline(SCHEME, large, peak_bytes=large_peak),
        MeasuredPipeline(SCHEME, small, peak_bytes=small_peak),
    ]
    state = apply_step(OnlineFitState(), true_profile, measured, 0)
    window = state.window(SCHEME)
    assert window.activation_scale == pytest.approx(1.05) and window.extra_static_bytes == pytest.approx(1e8)
    (change,) = state.capacity_changes
    assert change.to_tokens == derive_capacity_tokens(true_profile, corrected_entry(entry, 1.05, 1e8))
    assert change.to_tokens > 0.8 * entry.capacity_tokens


def test_a_scheme_whose_peaks_were_never_measured_gets_the_under_predicting_schemes_correction(true_profile) -> None:
    """`<1,2,1>` peaks at twice its model's activations; `<1,1,2>` never ran. Its capacity in the
    next profile is what its own model derives with the activations at `<1,2,1>`'s scale, where
    lower; once its own peaks are measured (as predicted here), its own correction rules."""
    entry = next(entry for entry in true_profile.schemes if entry.key == SCHEME)
    other = next(entry for entry in true_profile.schemes if entry.key == (1, 1, 2))
    large = (one_sequence(4096),)
    peak = entry.static_bytes + 2.0 * (online_fit.predicted_peak_bytes(entry, large) - entry.static_bytes)
    state = apply_step(OnlineFitState(), true_profile, [MeasuredPipeline(SCHEME, large, peak_bytes=peak)], 0)
    scale = online_fit.shared_activation_scale(state)
    assert scale == pytest.approx(2.0 * 1.05) == state.window(SCHEME).activation_scale
    expected = derive_capacity_tokens(true_profile, corrected_entry(other, scale))
    by_key = {entry.key: entry for entry in profile_at(state, true_profile).schemes}
    assert by_key[(1, 1, 2)].capacity_tokens == min(other.capacity_tokens, expected) < other.capacity_tokens
    # its own peak, as its model predicts: its own correction (none needed) replaces the borrowed one
    own = online_fit.predicted_peak_bytes(other, large)
    state = apply_step(state, true_profile, [MeasuredPipeline((1, 1, 2), large, peak_bytes=own)], 1)
    assert {entry.key: entry for entry in profile_at(state, true_profile).schemes}[(1, 1, 2)].capacity_tokens == (
        other.capacity_tokens
    )
    # a scheme the model over-predicts lends nothing
    calm = apply_step(OnlineFitState(), true_profile, [MeasuredPipeline(SCHEME, large, peak_bytes=0.9 * own)], 0)
    assert online_fit.shared_activation_scale(calm) == 1.0


def test_the_memory_correction_puts_every_peak_under_the_line() -> None:
    peaks = [(1, 100.0, 130.0), (2, 200.0, 215.0), (3, 400.0, 420.0)]
    scale, extra = online_fit.corrected_memory(peaks)
    assert scale >= 1.0 * 1.05
    assert all(scale / 1.05 * a + extra >= y - 1e-9 for _, a, y in peaks)
    assert any(abs(scale / 1.05 * a + extra - y) < 1e-9 for _, a, y in peaks)  # the least such e
    # one size cannot tell k from e: all of it on the activations
    assert online_fit.corrected_memory([(1, 100.0, 150.0), (2, 105.0, 140.0)]) == pytest.approx((1.5 * 1.05, 0.0))
    assert online_fit.corrected_memory([]) == (1.0, 0.0)


def test_error_jump_rule() -> None:
    assert is_error_jump(0.5, [0.02, 0.03]) == (False, 0.025)  # too little history
    assert is_error_jump(0.5, [0.02, 0.03, 0.04])[0]
    assert not is_error_jump(0.09, [0.02, 0.03, 0.02])[0]  # 3x the recent median but under 10%
    assert not is_error_jump(0.25, [0.1, 0.1, 0.1])[0]  # over 10% but not 3x


def test_pipelines_of_one_scheme_lower_its_capacity_once_by_the_worst_peak(true_profile) -> None:
    usable = true_profile.gpu_memory_bytes - true_profile.memory_reserve_bytes
    (pipeline,) = step_of(true_profile, 1)
    peaks = [0.5 * usable, 2.0 * usable, 1.0 * usable]
    pipelines = [MeasuredPipeline(SCHEME, pipeline.micro_batches, peak_bytes=peak) for peak in peaks]
    (change,) = apply_step(OnlineFitState(), true_profile, pipelines, 0).capacity_changes
    entry = next(entry for entry in true_profile.schemes if entry.key == SCHEME)
    assert change.from_tokens == entry.capacity_tokens and change.measured_peak_bytes == 2.0 * usable


def test_an_interleaved_scheme_is_refitted_apart_from_its_plain_one(true_profile):
    """Measurements of a `<1,2,1,2>` pipeline refit that profile entry (priced per chunk), never the
    plain `<1,2,1>` one beside it: the two keep separate windows and coefficients."""
    plain = next(entry for entry in true_profile.schemes if entry.key == SCHEME)
    interleaved = plain.model_copy(update={"v": 2, "capacity_tokens": plain.capacity_tokens})
    profile = true_profile.model_copy(update={"schemes": [*true_profile.schemes, interleaved]})
    key = (*SCHEME, 2)
    state = OnlineFitState()
    for step in range(6):
        # the interleaved pipeline runs 1.5x slower than its prior says
        measured = [dataclasses.replace(pipeline, scheme=key) for pipeline in step_of(true_profile, step, slow=1.5)]
        state = apply_step(state, profile, measured, state.version)
    assert state.window(key) is not None and state.window(SCHEME) is None
    refitted = profile_at(state, profile)
    after = {entry.key: entry for entry in refitted.schemes}
    # the plain entry has no window: its prior at the shared scales, never the interleaved fit
    scale_a, scale_b, scale_c = state.shared
    assert (after[SCHEME].a, after[SCHEME].b, after[SCHEME].c) == pytest.approx(
        (plain.a * scale_a, plain.b * scale_b, plain.c * scale_c)
    )
    assert (after[SCHEME].a, after[SCHEME].b) != pytest.approx((after[key].a, after[key].b))
    lengths = np.array([512, 1024, 300])
    s2, s1 = float((lengths.astype(float) ** 2).sum()), float(lengths.sum())
    before_s = interleaved.a * s2 + interleaved.b * s1 + interleaved.c
    after_s = after[key].a * s2 + after[key].b * s1 + after[key].c
    assert after_s > 1.2 * before_s
    assert online_fit.scheme_name(key) == "<1,2,1,2>"
