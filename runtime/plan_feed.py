"""Where each step's plan comes from: the run's plan files, or a planner asked step after step.

Offline (`RunSpec.plan_json` / `plan_jsons`), every plan is read and refused before any compute
(`validate_plan` on every rank). Online (`RunSpec.planner` set), rank 0, before each step, takes
the step's batch lengths from `RunSpec.next_lengths(step)` and asks `RunSpec.planner` for the
plan, giving it the previous step's plan (the switch context); it broadcasts the plan's JSON, or
the one-line reason it got none, to every rank, so every rank runs the same plan or stops with
the same error (`PlanSourceError`). Each plan is checked like an offline one before its step.

Closing the loop (`RunSpec.post_measurements`): after each step rank 0 hands the step's measured
body (`runtime.step_measurements`) to the planner's `record(body)` (`post_measurements` here):
the session's refit, or the local planner's in-process one, plans the next step. A failed or
refused record never stops training: it is one entry of the run's report (`loop`), and a refusal
that means a bug in the body (`MeasurementsRefused`, a 4xx other than 409 or 429) is also printed
as a warning on standard error, every time.

The runtime holds no planner itself: `planner` and `next_lengths` are objects the caller gives
(the CLI's local planner or its REST-session client, `api/cli/run_planning.py`); they must be
picklable, as they travel to spawned ranks, and only rank 0 calls them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch.distributed as dist

from hydraplan.planner.schemas import Plan
from hydraplan.runtime.assignment import PlanRefusedError, model_config_for, validate_plan
from hydraplan.runtime.watchdog import hold

__all__ = [
    "LengthSource",
    "MeasurementsRefused",
    "PlanSourceError",
    "StepPlanner",
    "post_measurements",
    "step_plans",
]


class StepPlanner(Protocol):
    """Plans one step's batch; `previous` is the plan of the step before (None for the first)."""

    def plan(self, lengths: Sequence[int], previous: Plan | None) -> Plan: ...


LengthSource = Callable[[int], list[int]]  # step -> the lengths of that step's global batch


class MeasurementsRefused(ValueError):
    """The planner refused a step's measurements as malformed (a bug on this side, not a load)."""


class PlanSourceError(RuntimeError):
    """The planner gave rank 0 no plan for a step (every rank raises it with the same line)."""


def step_plans(spec, rank: int, world_size: int) -> Iterator[tuple[Plan, object]]:
    """`(plan, model config)` of every step of `spec`, checked before that step's compute."""
    if spec.planner is None:
        yield from _offline(spec, world_size)
    else:
        yield from _online(spec, rank, world_size)


def _offline(spec, world_size: int) -> Iterator[tuple[Plan, object]]:
    texts = spec.step_plans()
    distinct = {text: Plan.model_validate_json(text) for text in dict.fromkeys(texts)}  # `--steps K`: one plan
    cfg = model_config_for(distinct[texts[0]], spec.models_file)
    for plan in distinct.values():
        validate_plan(plan, world_size, cfg)
    for text in texts:
        yield distinct[text], cfg


def _online(spec, rank: int, world_size: int) -> Iterator[tuple[Plan, object]]:
    cfg, previous = None, None
    for step in range(spec.steps):
        box: list = [None, None]  # the plan's JSON, or the reason there is none
        if rank == 0:
            box = _ask(spec, step, previous)
        dist.broadcast_object_list(box, src=0)
        text, error = box
        if error is not None:
            raise PlanSourceError(f"step {step}: no plan: {error}")
        plan = Plan.model_validate_json(text)
        if cfg is None:
            cfg = model_config_for(plan, spec.models_file)
        elif plan.cost_profile.model != previous.cost_profile.model:
            raise PlanRefusedError(
                f"step {step}: the plan's model {plan.cost_profile.model!r} differs from the run's "
                f"{previous.cost_profile.model!r}"
            )
        validate_plan(plan, world_size, cfg)
        yield plan, cfg
        previous = plan


def _ask(spec, step: int, previous: Plan | None) -> list:
    """Rank 0: the step's lengths and the planner's plan, as `[json, None]` or `[None, reason]`."""
    try:
        with hold(step, "plan"):  # the planner's waits are bounded by its own retries and timeouts
            lengths = spec.next_lengths(step)
            plan = spec.planner.plan(lengths, previous)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the one line every rank stops with
        return [None, " ".join(f"{type(exc).__name__}: {exc}".split())]
    return [plan.model_dump_json(), None]


def post_measurements(planner, body: dict, step: int) -> dict:
    """Rank 0: hand one step's measurements to `planner.record(body)`; what became of them, as
    one entry of the report's `loop` (never raises: a failed record must not stop training)."""
    left_out = body.pop("left_out", 0)
    entry = {"step": step, "profile_version": body.get("profile_version"), "posted": False, "left_out": left_out}
    entry["num_micro_batches"] = sum(len(pipeline["micro_batches"]) for pipeline in body["pipelines"])
    if not body["pipelines"]:
        entry["error"] = "nothing measured"
        return entry
    record = getattr(planner, "record", None)
    if record is None:
        entry["error"] = f"the planner ({type(planner).__name__}) takes no measurements"
        return entry
    try:
        with hold(step, "measurements"):  # bounded by the planner's own retries and timeouts
            fit = record(body)
    except Exception as exc:  # noqa: BLE001 - reported, training goes on
        line = " ".join(f"{type(exc).__name__}: {exc}".split())
        entry["error"] = line
        if isinstance(exc, MeasurementsRefused):
            print(f"hydraplan run: warning: step {step}: measurements refused: {line}", file=sys.stderr, flush=True)
        return entry
    errors = fit.get("errors") or []
    entry.update(posted=True, fit_version=fit.get("version"))
    if errors and errors[-1].get("step") == fit.get("num_steps"):
        entry["median_error"] = errors[-1].get("median_error")
    return entry
