"""The closed-loop benchmark's verdicts: the figures of one wrong / right pair, and the judgement over
repeated pairs (benchmarks/closed_loop.py; the runs themselves are benchmarks, not tests)."""

from __future__ import annotations

import pytest

from benchmarks import closed_loop
from benchmarks.closed_loop import RunResult, repeats_table, start_result, start_verdict

STEPS = 14


def run(name: str, errors: list[float], step_s: list[float], strategies: list[str] | None = None) -> RunResult:
    strategies = strategies or ["2x<1,1,1>"] * STEPS
    pipelines = [[("<1,1,1>", [0], 100, s / 2), ("<1,1,1>", [1], 100, s / 2)] for s in step_s]
    return RunResult(
        name=name,
        strategies=strategies,
        versions=list(range(STEPS)),
        errors=errors,
        step_s=step_s,
        pipelines=pipelines,
        wall_s=1.0,
        ratios=[[] for _ in range(STEPS)],
        slow_ranks=[{} for _ in range(STEPS)],
        peaks=[None] * STEPS,
        plans=[],
    )


def test_one_pair_takes_the_worst_late_error_and_the_summed_step_time():
    errors = [0.4] * 5 + [0.09] * 5 + [0.02, 0.08, 0.03, 0.05]
    wrong = run("wrong", errors, [1.0] * 10 + [1.0, 1.0, 1.0, 1.3])
    right = run("right", [0.03] * STEPS, [1.0] * STEPS)
    result = start_result(wrong, right)
    assert result.worst_error == pytest.approx(0.08)
    assert result.first_good == 5
    assert result.step_ratio == pytest.approx(0.3 / 4)  # 4.3 s against 4.0 s over steps 10-13
    assert result.error_ok and not result.time_ok
    assert result.same_plan_ratio == pytest.approx(0.0)  # every step planned alike, 13 of 14 equal
    text, error_ok, time_ok = start_verdict(wrong, right)
    assert (error_ok, time_ok) == (True, False)
    assert "+7.5%" in text and "NOT met" in text


def test_the_drift_counts_only_steps_planned_alike():
    strategies = ["2x<1,1,1>"] * 10 + ["1x<1,1,2>"] * 4
    wrong = run("wrong", [0.05] * STEPS, [0.95] * 10 + [0.5] * 4, strategies)
    right = run("right", [0.05] * STEPS, [1.0] * STEPS)
    result = start_result(wrong, right)
    assert result.same_plan_ratio == pytest.approx(-0.05)
    assert result.step_ratio == pytest.approx(-0.5)


def test_too_few_steps_give_no_verdict():
    short = run("wrong", [0.05] * STEPS, [1.0] * STEPS)
    for field in ("errors", "step_s", "strategies", "pipelines"):
        setattr(short, field, getattr(short, field)[:10])
    assert start_result(short, short) is None
    assert start_verdict(short, short)[1:] == (False, False)


def test_repeats_are_judged_on_their_medians():
    right = run("right", [0.03] * STEPS, [1.0] * STEPS)
    late_errors = (0.06, 0.15, 0.08)  # the second pair misses the error target
    late_times = (1.02, 1.0, 0.9)  # the third misses the step-time target
    pairs = [
        ("wrong then right", run("wrong", [0.05] * 10 + [e] * 4, [1.0] * 10 + [t] * 4), right)
        for e, t in zip(late_errors, late_times)
    ]
    table, verdict = repeats_table(pairs)
    assert table.count("\n") == 2 + len(pairs) - 1  # header, rule, one row per pair
    assert "8.0%" in verdict and "+0.0%" in verdict  # medians of 6/15/8% and +2/0/-10%
    assert "both targets met by 1 of 3 pairs" in verdict
    assert verdict.count("NOT met") == 0


def test_bad_repeats_and_a_foreign_profile_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        closed_loop.parse_args(["--repeats", "0"])
    assert stopped.value.code == 2
    assert "--repeats 0" in capsys.readouterr().err
    from hydraplan.cost_models.profile_io import bundled_profile, save_profile

    analytic = bundled_profile().model_copy(update={"provenance": None})
    path = tmp_path / "analytic.json"
    save_profile(analytic, path)
    with pytest.raises(SystemExit, match="analytic.json"):
        closed_loop.start_profile(closed_loop.parse_args(["--profile", str(path)]))
    with pytest.raises(SystemExit, match="missing.json"):
        closed_loop.start_profile(closed_loop.parse_args(["--profile", str(tmp_path / "missing.json")]))


def test_a_profile_of_another_host_is_named_as_such(tmp_path):
    from hydraplan.cost_models.profile_io import bundled_profile, save_profile
    from hydraplan.runtime.profiler import device_description

    here = device_description("cpu")
    profile = bundled_profile()
    for hardware, elsewhere in ((here, False), ("Some Other CPU, 64 cores", True)):
        provenance = profile.provenance.model_copy(update={"hardware": hardware})
        path = tmp_path / "measured.json"
        save_profile(profile.model_copy(update={"provenance": provenance}), path)
        args = closed_loop.parse_args(["--profile", str(path)])
        text = closed_loop.profile_text(args, closed_loop.start_profile(args))
        assert f"on {hardware}" in text
        assert ("not its right start" in text) is elsewhere
