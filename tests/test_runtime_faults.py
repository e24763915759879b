"""Faults of a run: a rank that exits or hangs stops every rank, within the stall timeout, naming
the rank; the watchdogs themselves (launcher and torchrun) on plain data and processes.

The two fault launches run 2 gloo ranks of `2x<1,1,1>` each (a failed launch cannot host
another scenario); the rest needs no torch launch.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from hydraplan.runtime import watchdog
from tests.runtime_plans import MINI_MODEL, fixed_plan, write_models_file
from tests.runtime_support import require_torch

LENGTHS = [5, 9, 2, 7, 12, 30, 8, 4, 11]


def slots(*beats: tuple[float, int, str]) -> list[float]:
    """A progress array of plain floats, one `(time, step, phase)` per rank."""
    return [value for at, step, phase in beats for value in (at, float(step), float(watchdog.PHASES.index(phase)))]


def test_the_rank_behind_is_named_and_the_waiting_ones_say_where():
    progress = slots((10.0, 1, "sync"), (8.0, 1, "compute"), (10.5, 1, "sync"))
    assert watchdog.stalled_for_s(progress, [0, 1, 2], now=20.5) == pytest.approx(10.0)
    culprits, line = watchdog.describe_stall(progress, [0, 1, 2], 10.0)
    assert culprits == [1]
    assert line == (
        "rank 1 made no progress for 10 s (step 1, running its micro-batches); "
        "the other ranks [0, 2] wait for it (step 1, in the gradient sync)"
    )
    # a rank of an earlier step is further behind than one of a later phase; finished ranks are not asked
    progress = slots((10.0, 2, "compute"), (9.0, 1, "optimizer"), (0.0, 0, "start"))
    assert watchdog.describe_stall(progress, [0, 1], 5.0)[0] == [1]
    assert watchdog.describe_stall(progress, [0, 1, 2], 5.0) == (
        [2],
        "rank 2 made no progress for 5 s (before its first beat); the other ranks [0, 1] wait for it "
        "(step 1, in the optimizer step; step 2, running its micro-batches)",
    )


def test_every_rank_stuck_in_the_same_place_is_named():
    progress = slots((3.0, 0, "sync"), (4.0, 0, "sync"))
    assert watchdog.describe_stall(progress, [0, 1], 61.0) == (
        [0, 1],
        "ranks [0, 1] made no progress for 61 s (step 0, in the gradient sync)",
    )
    assert watchdog.stalled_for_s(slots((0.0, 0, "start"), (0.0, 0, "start")), [0, 1], now=100.0) is None


def test_hold_keeps_beating_while_a_bounded_wait_runs():
    with watchdog.hold(4, "plan", every_s=0.05):
        first = watchdog.last_beat()
        time.sleep(0.3)
        later = watchdog.last_beat()
    assert first[1:] == later[1:] == (4, "plan") and later[0] > first[0]


WATCHED = """
import time
from hydraplan.runtime import watchdog
watchdog.beat(2, "sync")
with watchdog.LocalWatchdog(rank=3, stall_s=0.5, poll_s=0.05):
    time.sleep(60)
"""


def test_the_torchrun_watchdog_exits_a_stalled_rank_naming_it():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WATCHED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and time.monotonic() - started < 30
    line = r"hydraplan worker: rank 3: error: no progress for \d+ s \(step 2, in the gradient sync\): stopping"
    assert re.search(line, done.stderr), done.stderr


# ---------------------------------------------------------------------------------------------
# launches that fail on purpose
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fault_spec(tmp_path_factory):
    require_torch()
    from hydraplan.runtime.worker import RunSpec

    models_file = write_models_file(tmp_path_factory.mktemp("models") / "models.json")
    plan = fixed_plan("2x<1,1,1>", LENGTHS, 2, model=MINI_MODEL["name"])

    def spec(*faults) -> RunSpec:
        return RunSpec(plan_json=plan.model_dump_json(), steps=3, models_file=models_file, faults=faults)

    return spec


def stopped_processes() -> bool:
    import multiprocessing

    return not [child for child in multiprocessing.active_children() if child.name.startswith("hydraplan-rank")]


@pytest.mark.runtime
def test_a_rank_that_exits_stops_every_rank_naming_it(fault_spec):
    from hydraplan.runtime import launch
    from hydraplan.runtime.faults import EXIT_CODE
    from hydraplan.runtime.worker import run_worker

    with pytest.raises(launch.RankFailedError) as failed:
        launch.run_ranks(run_worker, 2, args=(fault_spec(("exit", 1, 1)),), timeout_s=300.0, stall_timeout_s=60.0)
    assert failed.value.rank == 1
    assert str(failed.value) == f"rank 1 failed: exited with code {EXIT_CODE} without a result"
    assert stopped_processes()


@pytest.mark.runtime
def test_a_rank_that_hangs_in_the_sync_stops_every_rank_within_the_stall_timeout(fault_spec):
    from hydraplan.runtime import launch
    from hydraplan.runtime.worker import run_worker

    started = time.monotonic()
    with pytest.raises(launch.RankStalledError) as stalled:
        launch.run_ranks(run_worker, 2, args=(fault_spec(("hang", 0, 2)),), timeout_s=300.0, stall_timeout_s=30.0)
    # the whole run may take 300 s; the hang was found 30 s after the last beat (not less here: on
    # this loaded 2-core machine, building the first layout once went 15 s without a beat)
    assert time.monotonic() - started < 200
    assert stalled.value.ranks == [0], str(stalled.value)
    assert str(stalled.value) == (
        "rank 0 made no progress for 30 s (step 2, running its micro-batches); "
        "the other ranks [1] wait for it (step 2, in the gradient sync) (every rank stopped)"
    )
    assert stopped_processes()


def test_cli_run_names_a_stalled_rank(tmp_path, monkeypatch, capsys):
    require_torch()
    from hydraplan.api.cli import main
    from hydraplan.runtime import launch

    def stalled(*args, **kwargs):
        assert kwargs["stall_timeout_s"] == 5.0
        raise launch.RankStalledError([1], "rank 1 made no progress for 5 s (step 0, in the gradient sync)")

    monkeypatch.setattr(launch, "run_ranks", stalled)
    models_file = write_models_file(tmp_path / "models.json")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(fixed_plan("2x<1,1,1>", LENGTHS, 2, model=MINI_MODEL["name"]).model_dump_json())
    argv = ["run", "--plan", str(plan_path), "--models-file", models_file, "--stall-timeout-s", "5"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "hydraplan: error: rank 1 made no progress for 5 s (step 0, in the gradient sync) (every rank stopped)\n"
    )
