"""The checker accepts planner output and rejects each kind of broken plan."""

from __future__ import annotations

import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.check import check_plan
from hydraplan.planner.schemas import Plan, PlanRequest, SolverOptions
from hydraplan.planner.solve import solve

PROFILE = synthetic_profile(max_gpus=16)


@pytest.fixture(scope="module")
def plan() -> Plan:
    lengths = wikipedia_like_batch(40_000, seed=5)
    # two pipelines of different schemes, so that cross-pipeline tampering has something to break
    options = SolverOptions(time_limit_s=2, strategy_pool=["1x<8,1,1> + 1x<4,2,1>"])
    return solve(PlanRequest(lengths=lengths, num_gpus=16, options=options), PROFILE)


def edited(plan: Plan, edit) -> Plan:
    """A deep copy of the plan's JSON with `edit` applied to it."""
    data = plan.model_dump(mode="json")
    edit(data)
    return Plan.model_validate(data)


def first_batch(data):
    return data["pipelines"][0]["micro_batches"][0]


def test_valid_plan_has_no_violations(plan):
    assert check_plan(plan) == []


@pytest.mark.parametrize(
    "name,edit,message",
    [
        (
            "missing sequence",
            lambda d: [first_batch(d)[k].pop() for k in ("sequence_ids", "lengths", "offsets")],
            "is missing",
        ),
        ("unknown id", lambda d: first_batch(d)["sequence_ids"].__setitem__(0, 10**6), "missing"),
        ("duplicate", lambda d: d["pipelines"][1]["micro_batches"].append(first_batch(d)), "placed 2 times"),
        ("over capacity", lambda d: d["pipelines"][0].__setitem__("capacity_tokens", 1), "capacity"),
        (
            "stage time",
            lambda d: first_batch(d).__setitem__("stage_time_s", first_batch(d)["stage_time_s"] * 0.9),
            "stage time",
        ),
        ("pipeline time", lambda d: d["pipelines"][0].__setitem__("time_s", 0.001), "simulated 1F1B"),
        ("step time", lambda d: d.__setitem__("step_time_s", d["step_time_s"] * 0.99), "step_time_s"),
        ("rank overlap", lambda d: d["pipelines"][1]["ranks"].__setitem__(0, d["pipelines"][0]["ranks"][0]), "ranks"),
        ("bound above step", lambda d: d.__setitem__("lower_bound_s", d["step_time_s"] * 2), "lower_bound_s"),
        ("gap", lambda d: d.__setitem__("gap", d["gap"] + 0.1), "gap"),
        ("strategy text", lambda d: d.__setitem__("strategy", "16x<1,1,1>"), "strategy"),
        ("no micro-batches", lambda d: d["pipelines"][0].__setitem__("micro_batches", []), "no micro-batches"),
        ("chunk overlap", lambda d: first_batch(d)["offsets"].__setitem__(0, 3), "tile"),
        ("num gpus", lambda d: d.__setitem__("num_gpus", 32), "cover"),
    ],
)
def test_each_kind_of_broken_plan_is_rejected(plan, name, edit, message):
    violations = check_plan(edited(plan, edit))
    assert violations, name
    assert any(message in violation for violation in violations), violations


def test_checking_against_a_different_profile_recomputes_costs(plan):
    slower = PROFILE.model_copy(update={"schemes": [s.model_copy(update={"b": s.b * 2}) for s in PROFILE.schemes]})
    violations = check_plan(plan, slower)
    assert any("stage time" in violation for violation in violations)
    used = plan.pipelines[0].scheme
    without_used = [s for s in PROFILE.schemes if (s.tp, s.pp, s.cp) != (used.tp, used.pp, used.cp)]
    violations = check_plan(plan, PROFILE.model_copy(update={"schemes": without_used}))
    assert any("not in the cost profile" in violation for violation in violations)
