"""Faults of a run: a rank that exits, hangs or is stopped (SIGSTOP, mid-step or during start-up)
stops every rank, within the stall timeout, naming the rank; a SIGTERM or SIGKILL of the launcher
leaves no rank alive; the watchdogs themselves (launcher and torchrun) on plain data and processes.

The fault launches run 2 gloo ranks each (a failed launch cannot host another scenario); the
launcher tests run `hydraplan run` as a child process and poll its ranks' pids in /proc (Linux).
Nothing here depends on the machine's speed: the tests wait for events (progress lines, pids) with
generous limits.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hydraplan.runtime import watchdog
from tests.runtime_plans import MINI_MODEL, fixed_plan, write_models_file
from tests.runtime_support import require_torch

LENGTHS = [5, 9, 2, 7, 12, 30, 8, 4, 11]


def slots(*beats: tuple) -> list[float]:
    """A progress array of plain floats, one `(time, step, phase[, waiting])` per rank."""
    return [
        value
        for at, step, phase, *waits in beats
        for value in (at, float(step), float(watchdog.PHASES.index(phase)), float(bool(waits and waits[0])))
    ]


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


def test_the_rank_not_waiting_for_a_peer_is_named_among_ranks_at_the_same_place():
    # stage 0 stopped in its forward; stage 1 waits in its receive, in the same phase
    progress = slots((5.0, 1, "compute", False), (6.0, 1, "compute", True))
    assert watchdog.describe_stall(progress, [0, 1], 20.0, pids={0: 4242, 1: 4243}) == (
        [0],
        "rank 0 (pid 4242) made no progress for 20 s (step 1, running its micro-batches); "
        "the other ranks [1] wait for it (step 1, running its micro-batches)",
    )


def test_start_up_is_watched_from_the_launch_and_a_rank_before_its_first_beat_is_named():
    # rank 0 joined the group and waits there; rank 1 never beat (stopped while importing torch)
    progress = slots((50.0, 0, "join", True), (0.0, 0, "start"))
    assert watchdog.stalled_for_s(progress, [0, 1], now=80.0, alive_at={0: 1.0, 1: 40.0}) == pytest.approx(30.0)
    assert watchdog.stalled_for_s(slots((0.0, 0, "start")), [0], now=80.0, alive_at={0: 60.0}) == pytest.approx(20.0)
    assert watchdog.describe_stall(progress, [0, 1], 30.0, pids={1: 7}) == (
        [1],
        "rank 1 (pid 7) made no progress for 30 s (before its first beat); the other ranks [0] wait for it "
        "(joining the process group)",
    )


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
    # rank 0 started its gradient buckets during its last backward (overlap), so rank 1's sync
    # completes and it waits in the loss all-reduce. The whole run may take 300 s; the hang was
    # found 30 s after the last beat (not less here: on
    # this loaded 2-core machine, building the first layout once went 15 s without a beat)
    assert time.monotonic() - started < 200
    assert stalled.value.ranks == [0], str(stalled.value)
    assert re.fullmatch(
        r"rank 0 \(pid \d+\) made no progress for 30 s \(step 2, running its micro-batches\); "
        r"the other ranks \[1\] wait for it \(step 2, in the loss all-reduce\) \(every rank stopped\)",
        str(stalled.value),
    ), str(stalled.value)
    assert stopped_processes()


@pytest.mark.runtime
def test_a_rank_stopped_mid_step_is_found_by_the_stall_timeout_and_named(tmp_path):
    """SIGSTOP of stage 0 in its first forward of step 1; stage 1 then waits in its receive (the
    same step and phase): the stopped rank is named, not both."""
    require_torch()
    from hydraplan.runtime import launch
    from hydraplan.runtime.worker import RunSpec, run_worker

    models_file = write_models_file(tmp_path / "models.json")
    plan = fixed_plan("1x<1,2,1>", LENGTHS, 2, model=MINI_MODEL["name"])
    spec = RunSpec(plan_json=plan.model_dump_json(), steps=3, models_file=models_file, faults=(("stop", 0, 1),))
    with pytest.raises(launch.RankStalledError) as stalled:
        launch.run_ranks(run_worker, 2, args=(spec,), timeout_s=300.0, stall_timeout_s=20.0)
    assert stalled.value.ranks == [0], str(stalled.value)
    assert re.fullmatch(
        r"rank 0 \(pid \d+\) made no progress for \d+ s \(step 1, running its micro-batches\); "
        r"the other ranks \[1\] wait for it \(step 1, running its micro-batches\) \(every rank stopped\)",
        str(stalled.value),
    ), str(stalled.value)
    assert stopped_processes()


# ---------------------------------------------------------------------------------------------
# the launcher as a process: killed, or one of its ranks stopped during start-up
# ---------------------------------------------------------------------------------------------


def _process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (None: no such process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _process_state(pid) not in (None, "Z", "X")


def _rank_pids(launcher_pid: int) -> list[int]:
    """The launcher's spawned rank processes (not multiprocessing's resource tracker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == launcher_pid and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def _both_ranks(launcher_pid: int) -> list[int]:
    pids = _rank_pids(launcher_pid)
    return pids if len(pids) == 2 else []


def _wait_for(predicate, limit_s: float, what: str):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {limit_s:g} s: {what}")


def _launch_run(tmp_path, *flags: str) -> subprocess.Popen:
    require_torch()
    if not sys.platform.startswith("linux"):
        pytest.skip("the launcher tests read /proc")
    models_file = write_models_file(tmp_path / "models.json")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(fixed_plan("2x<1,1,1>", LENGTHS, 2, model=MINI_MODEL["name"]).model_dump_json())
    argv = [sys.executable, "-m", "hydraplan.api.cli", "run", "--plan", str(plan_path), "--models-file", models_file]
    return subprocess.Popen([*argv, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:  # only if the test failed: ranks this test started
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.runtime
@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_ranks_die_with_their_launcher(tmp_path, signal_number):
    launcher = _launch_run(tmp_path, "--steps", "100000", "--progress", "--timeout-s", "600")
    pids: list[int] = []
    try:
        for line in launcher.stderr:  # a step's line ends when it is done: the ranks train the next one
            if "done in" in line:
                break
        pids = _rank_pids(launcher.pid)
        assert len(pids) == 2 and all(map(_alive, pids)), pids
        launcher.send_signal(signal_number)
        launcher.wait(timeout=60)
        _wait_for(lambda: not any(map(_alive, pids)), 60.0, f"ranks {pids} gone after the launcher's {signal_number!r}")
    finally:
        launcher.kill()
        _kill_leftovers(pids)


@pytest.mark.runtime
def test_a_rank_stopped_during_start_up_is_found_by_the_stall_timeout_and_named(tmp_path):
    launcher = _launch_run(tmp_path, "--stall-timeout-s", "15", "--timeout-s", "600")
    pids: list[int] = []
    try:
        stopped = _wait_for(lambda: _rank_pids(launcher.pid)[:1], 120.0, "a rank process")[0]
        os.kill(stopped, signal.SIGSTOP)  # while it imports torch: before its first beat
        pids = _wait_for(lambda: _both_ranks(launcher.pid), 120.0, "both rank processes")
        started = time.monotonic()
        _, stderr = launcher.communicate(timeout=300)
        assert launcher.returncode == 1, stderr
        assert time.monotonic() - started < 200
        found = re.search(r"rank (\d) \(pid (\d+)\) made no progress for (\d+) s \(before its first beat\)", stderr)
        assert found and int(found.group(2)) == stopped, stderr
        assert int(found.group(3)) >= 15
        _wait_for(lambda: not any(map(_alive, pids)), 60.0, f"ranks {pids} gone")
    finally:
        launcher.kill()
        _kill_leftovers(pids)


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


NO_TORCH = """
import sys
sys.modules["torch"] = None  # as if the runtime extra were not installed
from hydraplan.api.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("source", [["--plan", "PLAN"], ["--nproc", "2"]], ids=["plan", "online"])
def test_run_without_torch_is_one_line_and_exit_2(tmp_path, source):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(fixed_plan("2x<1,1,1>", LENGTHS, 2, model=MINI_MODEL["name"]).model_dump_json())
    argv = ["run", *[str(plan_path) if arg == "PLAN" else arg for arg in source]]
    done = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("hydraplan: error: the runtime extra is not installed: pip install")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_nccl_is_refused_before_any_rank_without_a_cuda_device_per_rank(tmp_path, monkeypatch, capsys):
    torch = require_torch()
    from hydraplan.api.cli import main
    from hydraplan.runtime import launch, worker

    monkeypatch.setattr(launch, "run_ranks", lambda *a, **k: pytest.fail("a refused run must start no rank"))
    models_file = write_models_file(tmp_path / "models.json")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(fixed_plan("2x<1,1,1>", LENGTHS, 2, model=MINI_MODEL["name"]).model_dump_json())
    argv = ["run", "--plan", str(plan_path), "--models-file", models_file, "--backend", "nccl"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "hydraplan: error: --backend nccl: no CUDA device is available (torch.cuda.is_available() is False); use gloo\n"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "hydraplan: error: --backend nccl: 2 ranks need 2 CUDA devices, this machine has 1\n"
    )
    # the torchrun worker refuses the same way (one line, exit 2) before joining any group
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    worker_argv = ["--plan", str(plan_path), "--models-file", models_file, "--backend", "nccl"]
    assert worker.main(worker_argv) == 2
    assert capsys.readouterr().err.startswith("hydraplan worker: error: --backend nccl: 2 ranks need 2 CUDA devices")
