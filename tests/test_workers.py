"""Planning with worker processes (`solve(executor=...)`): the baselines' plans are made there
and the search's next strategies are solved there ahead of it, and the plan is the same, byte for
byte, as without them, with one or two workers."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Executor, Future, ProcessPoolExecutor

import pytest
from synthetic import wikipedia_like_batch

from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner import speculation
from hydraplan.planner.schemas import PlanRequest, SolverOptions
from hydraplan.planner.solve import solve
from hydraplan.planner.speculation import SpeculativeSolver

# the clock must not decide anything here: a budget far above what the work limits take
# the work limits end these searches (~1-10 s of CPU); the clock is a liveness limit only: at
# load 15 on the 2-core host a 60 s clock cut one of them
OPTIONS = {"time_limit_s": 600.0, "oversize": "split"}


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as executor:
        yield executor


@pytest.fixture(scope="module")
def pool2():
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork")) as executor:
        yield executor


@pytest.fixture
def speculation_counts(monkeypatch):
    """(worker results taken, solves made here) of each speculative solver, when it closes."""
    counts: list[tuple[int, int]] = []
    close = SpeculativeSolver.close

    def spy(self):
        counts.append((self.hits, self.local))
        close(self)

    monkeypatch.setattr(SpeculativeSolver, "close", spy)
    return counts


@pytest.mark.parametrize(
    ("model", "num_gpus", "num_tokens", "seed", "previous"),
    [
        ("llama3-8b", 32, 300_000, 0, None),
        ("llama3-70b", 64, 400_000, 1, None),
        ("llama3-8b", 32, 150_000, 2, "4x<2,1,4>"),
    ],
)
def test_the_same_plan_with_one_and_two_workers(
    pool, pool2, speculation_counts, model, num_gpus, num_tokens, seed, previous
) -> None:
    profile = build_profile(get_model(model), get_gpu("h100-sxm-80gb"), num_gpus, 8)
    request = PlanRequest(
        lengths=wikipedia_like_batch(num_tokens, seed=seed),
        num_gpus=num_gpus,
        options=SolverOptions(seed=seed, **OPTIONS),
        previous_strategy=previous,
    )
    alone = solve(request, profile)
    for executor, workers in ((pool, 1), (pool2, 2)):
        helped = solve(request, profile, executor=executor, executor_workers=workers)
        assert not alone.solver.cut_by_clock and not helped.solver.cut_by_clock
        assert helped.model_dump_json() == alone.model_dump_json()
    # one worker only makes the baselines' plans; two also compute ahead (which of their tasks
    # had started when the search asked depends on timing: `ImmediateExecutor` below fixes that)
    assert len(speculation_counts) == 1


class ImmediateExecutor(Executor):
    """Runs each task at once, in this process, through the workers' own code (`solve_task`,
    `expand_task`, `polish_task` from the pickled blobs): every task sent ahead is done when the
    search asks for it, whatever the machine's load."""

    def submit(self, fn, /, *args, **kwargs):
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:  # noqa: BLE001 - handed to the search like a worker's
            future.set_exception(error)
        return future


def test_the_plan_is_the_same_when_every_task_comes_from_a_worker(monkeypatch, speculation_counts) -> None:
    """Every solve, expansion and polish sent ahead is taken from the worker path (none is too
    cheap to send here): the plan is still byte for byte the search's own."""
    monkeypatch.setattr(speculation, "MIN_TASK_S", 0.0)
    profile = build_profile(get_model("llama3-70b"), get_gpu("h100-sxm-80gb"), 64, 8)
    request = PlanRequest(
        lengths=wikipedia_like_batch(400_000, seed=1), num_gpus=64, options=SolverOptions(seed=1, **OPTIONS)
    )
    alone = solve(request, profile)
    helped = solve(request, profile, executor=ImmediateExecutor(), executor_workers=2)
    assert helped.model_dump_json() == alone.model_dump_json()
    ((taken, here),) = speculation_counts
    assert taken > 20, (taken, here)  # most of what the search asked for came from the worker path


def test_the_worker_makes_the_baselines_plans(pool, monkeypatch) -> None:
    """With a worker, this process never makes the baselines' plans itself (its own maker is
    broken here), and they still join: the plan names the baseline it grew from."""
    import hydraplan.planner.solve as solve_module
    from hydraplan.api.datasets import sample_batch

    def broken(*args, **kwargs):
        raise AssertionError("the baselines' plans were made in this process")

    monkeypatch.setattr(solve_module, "peer_candidates", broken)
    profile = build_profile(get_model("llama-32b"), get_gpu("a100-80gb"), 64, 8)
    lengths = sample_batch("lognormal", 200_000, 0, 32768)
    request = PlanRequest(lengths=lengths, num_gpus=64, options=SolverOptions(seed=0, **OPTIONS))
    with pytest.raises(AssertionError, match="made in this process"):
        solve(request, profile)
    assert solve(request, profile, executor=pool).solver.winner == "flexsp"


def test_the_command_line_plans_the_same_with_one_and_two_workers() -> None:
    """`hydraplan plan --workers 1`, `2` and `3` (forked workers make the baselines' plans and
    solve strategies ahead) print the same plan JSON, byte for byte; a budget the work limits
    never reach."""
    import subprocess
    import sys

    outputs = []
    for workers in ("1", "2", "3"):
        argv = [sys.executable, "-m", "hydraplan.api.cli", "plan", "--num-tokens", "200000", "--num-gpus", "32"]
        argv += ["--time-limit-s", "60", "--workers", workers, "--json"]
        outputs.append(subprocess.run(argv, check=True, capture_output=True, timeout=300).stdout)
    assert outputs[0] == outputs[1] == outputs[2] and b'"plan_id"' in outputs[0]
