"""`hydraplan run`'s per-step progress lines (`api.cli.run_progress`) and the launcher's hook that
feeds them (`runtime.watchdog.furthest_behind`), without starting any rank."""

from __future__ import annotations

from types import SimpleNamespace

from hydraplan.api.cli.run_progress import StepProgress, step_head, summary_line


def test_step_head_names_the_plan_and_its_prediction() -> None:
    assert step_head(2, 5, "1x<2,1,1> + 1x<1,2,1>", 0.41234) == (
        "hydraplan: run step 2/5 (plan 1x<2,1,1> + 1x<1,2,1>, predicted 0.412 s) ... "
    )
    assert step_head(1, 3, None, None) == "hydraplan: run step 1/3 (planned online by rank 0) ... "


def test_summary_compares_the_mean_step_times() -> None:
    assert summary_line([0.5, 1.5], [2.0, 4.0]) == (
        "hydraplan: run: 2 step(s), mean step time predicted 1 s, measured 3 s "
        "(3x the prediction; measured: slowest pipeline's critical path + gradient sync)"
    )
    assert "(1,620x the prediction;" in summary_line([0.0005], [0.81])  # a GPU plan run on CPU ranks


def test_one_line_per_step_from_the_launchers_beats() -> None:
    written: list[str] = []
    now = iter([10.0, 11.5, 11.5, 14.0])
    plans = [
        SimpleNamespace(strategy="2x<1,1,1>", step_time_s=0.25),
        SimpleNamespace(strategy="1x<2,1,1>", step_time_s=0.5),
    ]
    progress = StepProgress(plans, 2, first_step=3, write=written.append, clock=lambda: next(now))
    # (step, phase) of the rank furthest behind, as run_ranks reports it; numbering starts past --load
    for beat in [(3, "start"), (3, "switch"), (3, "compute"), (3, "optimizer"), (4, "compute"), (5, "done")]:
        progress(*beat)
    assert "".join(written) == (
        "hydraplan: run step 1/2 (plan 2x<1,1,1>, predicted 0.25 s) ... done in 1.5 s\n"
        "hydraplan: run step 2/2 (plan 1x<2,1,1>, predicted 0.5 s) ... done in 2.5 s\n"
    )


def test_a_run_stopped_inside_a_step_ends_its_line() -> None:
    written: list[str] = []
    now = iter([0.0, 0.5])
    progress = StepProgress(None, 4, 0, written.append, clock=lambda: next(now))
    progress(0, "compute")
    progress.fail()
    progress.fail()  # nothing left open
    assert "".join(written) == "hydraplan: run step 1/4 (planned online by rank 0) ... failed after 0.5 s\n"


def test_the_rank_furthest_behind_is_reported_once_every_rank_has_beaten() -> None:
    from hydraplan.runtime.watchdog import PHASES, furthest_behind

    # slots per rank: monotonic time of the last beat (0: none), step, phase index, waiting
    phase = PHASES.index
    assert furthest_behind([5.0, 1, phase("compute"), 0, 0.0, 0, 0, 0], 2) is None
    assert furthest_behind([5.0, 1, phase("compute"), 0, 6.0, 1, phase("loss"), 1], 2) == (1, "compute")
    assert furthest_behind([5.0, 2, phase("plan"), 0, 6.0, 1, phase("optimizer"), 0], 2) == (1, "optimizer")


def test_the_launchers_watch_calls_the_hook_on_each_new_position() -> None:
    from hydraplan.runtime.launch import _ProgressWatch
    from hydraplan.runtime.watchdog import PHASES

    shared = [1.0, 0, 0, 0, 1.0, 0, 0, 0]
    seen: list[tuple[int, str]] = []
    watch = _ProgressWatch(shared, 2, lambda step, phase: seen.append((step, phase)))
    watch.poll()
    watch.poll()  # unchanged: not reported again
    compute = PHASES.index("compute")
    shared[:] = [2.0, 0, compute, 0, 2.0, 0, compute, 1]
    watch.poll()
    assert seen == [(0, "start"), (0, "compute")]
