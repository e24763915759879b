"""The bound certificate and its independent verifier (`planner.verify_bound`): the verified bound
never exceeds the brute-forced optimum, a claim above the optimum or a certificate with a part left
out or altered fails naming the part, and the verifier shares none of the solver's code."""

from __future__ import annotations

import ast
import json
from functools import cache
from pathlib import Path

import pytest
from test_exhaustive import (
    MAX_SCHEMES,
    QUICK_INTERLEAVED_CASES,
    optimum_s,
    random_instance,
    random_interleaved_instance,
)
from test_verify_bound_kinds import scaled_instance

from hydraplan.planner.check import check_plan, content_plan_id
from hydraplan.planner.schemas import Plan, PlanRequest, SolverOptions
from hydraplan.planner.solve import evaluate_strategy, solve
from hydraplan.planner.strategies import parse_strategy
from hydraplan.planner.verify_bound import verify_bound

QUICK_CASES = range(8)  # the exhaustive suite's first instances: their optima take ~0.5 s each


@cache
def solved(case: int) -> tuple[Plan, object, PlanRequest, float]:
    profile, lengths, num_gpus = random_instance(case)
    options = SolverOptions(time_limit_s=5, max_schemes=MAX_SCHEMES)
    request = PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=options)
    plan = solve(request, profile)
    assert check_plan(plan, profile, request) == []
    return plan, profile, request, optimum_s(profile, lengths, num_gpus)


def with_certificate(plan: Plan, edit) -> Plan:
    """The plan with its certificate edited by `edit(dict)` (plan_id left as it was: the verifier
    is asked directly)."""
    data = plan.bound_certificate.model_dump(mode="json")
    edit(data)
    return plan.model_copy(update={"bound_certificate": type(plan.bound_certificate).model_validate(data)})


def assert_verified_at_most_optimum(case: int) -> None:
    plan, profile, request, optimum = solved(case)
    verification = verify_bound(plan, profile, request)
    assert verification.verified_bound_s <= optimum * (1 + 1e-9), (case, verification.verified_bound_s, optimum)
    if verification.ok:
        assert verification.verified_bound_s >= plan.lower_bound_s * (1 - 1e-6)
    # a bound raised just above the optimum can never verify
    raised = plan.model_copy(update={"lower_bound_s": optimum * 1.001})
    tampered = verify_bound(raised, profile, request)
    assert not tampered.ok and tampered.violations, case


@pytest.mark.parametrize("case", QUICK_CASES)
def test_verified_bound_is_at_most_the_brute_forced_optimum(case: int) -> None:
    assert_verified_at_most_optimum(case)


def test_every_tiny_plan_verifies_its_claimed_bound_and_a_raised_claim_fails_naming_a_part() -> None:
    """On the quick instances the verifier proves every claimed bound; the costlier kinds lift the
    parts the cheap bounds leave below (the LP bubble dual, the packing, the assignment search,
    each on some plan); and the same plans with the claim raised just above the brute-forced
    optimum fail, naming a set or strategy below it."""
    kinds: set[str] = set()
    for case in QUICK_CASES:
        plan, profile, request, optimum = solved(case)
        verification = verify_bound(plan, profile, request)
        assert verification.ok, (case, verification.violations)
        kinds |= set(verification.raised_by)
        raised = verify_bound(plan.model_copy(update={"lower_bound_s": optimum * 1.001}), profile, request)
        assert not raised.ok
        assert any(v.startswith(("set {", "strategy ")) for v in raised.violations), raised.violations
    assert {"strategy: bubble dual (LP floors)", "strategy: packing", "strategy: assignment"} <= kinds, kinds


def verified_case() -> tuple[Plan, object, PlanRequest]:
    for case in QUICK_CASES:
        plan, profile, request, _ = solved(case)
        if verify_bound(plan, profile, request).ok:
            return plan, profile, request
    raise AssertionError("no quick case verifies")


def test_an_expanded_set_left_out_fails_naming_it() -> None:
    """Leaving out an expanded set whose set bound alone is below the claim leaves it covered by
    that set bound only: the verifier names it. Sets covered either way may go."""
    failed = 0
    for _, _, _, verification in sets_left_out():
        if not verification.ok:
            failed += 1
            assert any("(not expanded): verified set bound" in v for v in verification.violations)
    assert failed >= 1


def sets_left_out():
    """For every quick plan that verifies and each of its expanded sets: (the plan with that set
    left out of its certificate, its profile, its request, the verification of the cut plan)."""
    for case in QUICK_CASES:
        plan, profile, request, _ = solved(case)
        if not verify_bound(plan, profile, request).ok:
            continue
        for index in range(len(plan.bound_certificate.expanded)):
            cut = with_certificate(plan, lambda data, index=index: data["expanded"].pop(index))
            yield cut, profile, request, verify_bound(cut, profile, request)


@pytest.mark.parametrize("case", QUICK_INTERLEAVED_CASES)
def test_interleaved_plans_verify_at_most_the_brute_forced_optimum(case: int) -> None:
    """Searches over profiles with `<tp,pp,cp,2>` entries (the exhaustive suite's interleaved
    instances): the verifier prices them with its own interleaved floors (re-solving the LP of the
    (pp, v) pairs the solver's table holds, (2, 2) and (3, 2)), its bound is at most the optimum,
    and it proves the claimed bound."""
    profile, lengths, num_gpus = random_interleaved_instance(case)
    request = PlanRequest(
        lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=SolverOptions(time_limit_s=5, max_schemes=2)
    )
    plan = solve(request, profile)
    verification = verify_bound(plan, profile, request)
    assert verification.verified_bound_s <= optimum_s(profile, lengths, num_gpus) * (1 + 1e-9)
    assert verification.ok, verification.violations


def test_a_scheme_left_out_of_the_certificate_fails() -> None:
    plan, profile, request = verified_case()
    schemes = plan.bound_certificate.schemes
    dropped = schemes[-1]

    def drop_last(data: dict) -> None:
        data["schemes"].pop()
        data["expanded"] = [entry for entry in data["expanded"] if len(schemes) - 1 not in entry["schemes"]]

    verification = verify_bound(with_certificate(plan, drop_last), profile, request)
    assert f"bound certificate: scheme {dropped} is left out of its schemes and no listed scheme dominates it" in (
        verification.violations
    )


def test_a_smaller_space_than_the_request_fails() -> None:
    plan, profile, request = verified_case()
    narrowed = with_certificate(plan, lambda data: data.update(max_schemes=1))
    assert (
        "bound certificate: max_schemes 1 is not the request's 2" in verify_bound(narrowed, profile, request).violations
    )


def test_a_plan_without_certificate_and_a_malformed_one_fail() -> None:
    plan, profile, request = verified_case()
    bare = plan.model_copy(update={"bound_certificate": None})
    assert verify_bound(bare, profile, request).violations == ["bound: the plan carries no bound certificate"]
    unknown = with_certificate(plan, lambda data: data["schemes"].append("<64,1,1>"))
    violations = verify_bound(unknown, profile, request).violations
    assert "bound certificate: scheme <64,1,1> is not in the profile" in violations
    shuffled = with_certificate(plan, lambda data: data["expanded"].append({"schemes": [1, 0]}))
    assert any("is not increasing scheme indices" in v for v in verify_bound(shuffled, profile, request).violations)


def test_any_multipliers_give_a_valid_bound() -> None:
    """Witness multipliers only help the verifier: zeroed or scrambled, the verified bound can fall
    (and the check fail) but never rise above the optimum."""
    for case in QUICK_CASES:
        plan, profile, request, optimum = solved(case)

        def scramble(data: dict) -> None:
            for entry in data["expanded"]:
                for witness in entry["strategies"]:
                    witness["multipliers"] = [float(k % 3) for k in range(len(witness["multipliers"]))]

        verification = verify_bound(with_certificate(plan, scramble), profile, request)
        assert verification.verified_bound_s <= optimum * (1 + 1e-9)


def test_the_certificate_is_part_of_the_plan_id() -> None:
    """Editing the certificate changes the content hash: the checker names the stale plan_id."""
    plan, profile, request = verified_case()
    assert content_plan_id(plan) == plan.plan_id
    edited = with_certificate(plan, lambda data: data.update(pricing_cap_s=1.0))
    assert any(v.startswith("plan_id ") for v in check_plan(edited, profile, request))
    bare = plan.model_copy(update={"bound_certificate": None})
    assert content_plan_id(bare) != plan.plan_id  # and a plan without one hashes without the field


def test_a_fixed_strategy_plan_verifies() -> None:
    profile, lengths, num_gpus = random_instance(0)
    request = PlanRequest(lengths=lengths, num_gpus=num_gpus, options=SolverOptions(max_schemes=MAX_SCHEMES))
    strategy = parse_strategy(f"{num_gpus}x<1,1,1>")
    plan = evaluate_strategy(request, profile, strategy)
    assert plan.bound_certificate.space == "fixed"
    verification = verify_bound(plan, profile, request)
    assert verification.ok, verification.violations
    assert verification.verified_bound_s <= plan.objective_s * (1 + 1e-9)
    raised = plan.model_copy(update={"lower_bound_s": plan.objective_s * 1.5})
    assert any(v.startswith("strategy ") for v in verify_bound(raised, profile, request).violations)


def test_the_verifier_imports_none_of_the_solver() -> None:
    tree = ast.parse((Path(__file__).resolve().parents[1] / "planner" / "verify_bound.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    project = {module for module in imported if module.startswith("hydraplan")}
    assert project <= {"hydraplan.planner", "hydraplan.planner.schemas", "hydraplan.planner.reference"}, project


def test_the_certificate_round_trips_through_json() -> None:
    plan, profile, request = verified_case()
    again = Plan.model_validate(json.loads(plan.model_dump_json()))
    assert again.bound_certificate == plan.bound_certificate
    assert verify_bound(again, profile, request).ok


def needed_set_left_out() -> tuple[Plan, object, PlanRequest, str]:
    """A verified plan with an expanded set it needs left out of its certificate (plan_id updated,
    so the checker passes it), and that set's text."""
    for cut, profile, request, verification in sets_left_out():
        if not verification.ok:
            cut = cut.model_copy(update={"plan_id": content_plan_id(cut)})
            return cut, profile, request, verification.violations[0]
    raise AssertionError("no certificate needs one of its expanded sets")


def test_cli_check_bound(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`hydraplan check --bound`: exit 0 with the verified bound, 1 naming the failing part, 2
    without the profile that defines the space."""
    from hydraplan.api.cli import main

    plan, profile, request = verified_case()
    cut, _, _, violation = needed_set_left_out()
    paths = {name: tmp_path / f"{name}.json" for name in ("plan", "profile", "request", "cut")}
    paths["plan"].write_text(plan.model_dump_json())
    paths["profile"].write_text(profile.model_dump_json())
    paths["request"].write_text(request.model_dump_json())
    paths["cut"].write_text(cut.model_dump_json())
    common = ["--profile", str(paths["profile"]), "--request", str(paths["request"]), "--bound"]
    assert main(["check", str(paths["plan"]), *common]) == 0
    out = capsys.readouterr().out
    assert "plan OK" in out and "bound: claimed" in out and "verified" in out
    assert check_plan(cut, profile, request) == []  # a valid plan whose certificate does not prove its bound
    _, cut_profile, cut_request, _ = needed_set_left_out()
    paths["profile"].write_text(cut_profile.model_dump_json())
    paths["request"].write_text(cut_request.model_dump_json())
    assert main(["check", str(paths["cut"]), *common]) == 1
    out = capsys.readouterr().out
    assert "plan INVALID" in out and violation in out
    assert main(["check", str(paths["plan"]), "--bound"]) == 2
    assert "--bound needs --profile" in capsys.readouterr().err


@pytest.mark.parametrize("case", [0, 3])
def test_a_claim_above_the_optimum_fails_with_times_in_seconds_and_any_pricing_cap(case: int) -> None:
    """The quick instances with every time x1000 (`scaled_instance`: seconds, where a product of two
    times exceeds their sum) and the certificate's pricing cap raised to 10x the objective (any
    positive cap is valid): the plan's own claim still verifies at its cap, and a claim 0.1% above
    the (scaled) brute-forced optimum fails."""
    profile, lengths, num_gpus = scaled_instance(case, 1000.0)
    request = PlanRequest(
        lengths=lengths,
        num_gpus=num_gpus,
        gpus_per_node=8,
        options=SolverOptions(time_limit_s=5, max_schemes=MAX_SCHEMES),
    )
    plan = solve(request, profile)
    assert verify_bound(plan, profile, request).ok
    optimum = solved(case)[3] * 1000.0
    high_cap = with_certificate(plan, lambda data: data.update(pricing_cap_s=10 * plan.objective_s))
    raised = verify_bound(high_cap.model_copy(update={"lower_bound_s": optimum * 1.001}), profile, request)
    assert not raised.ok and raised.verified_bound_s <= optimum * (1 + 1e-9), raised


def test_a_pool_strategy_is_bounded_without_the_plans_switch_cost() -> None:
    """Only the plan's own strategy pays its switch: a pool member equal to the previous strategy
    switches for free. A valid but slow pool plan (the clock cut it, say) that switched away from
    a faster previous strategy: a claim just above that previous strategy's own objective must not
    verify, although the plan's switch cost added to every member would prove it."""
    base, lengths, num_gpus = random_instance(0)
    profile = base.model_copy(update={"grad_sync_bandwidth_bytes_per_s": 1e8})  # switches cost seconds
    slow, kept = f"{num_gpus}x<1,1,1>", "1x<1,3,1> + 1x<1,1,1>"

    def request_of(pool: list[str]) -> PlanRequest:
        options = SolverOptions(max_schemes=MAX_SCHEMES, strategy_pool=pool, time_limit_s=2)
        return PlanRequest(lengths=lengths, num_gpus=num_gpus, previous_strategy=kept, options=options)

    switched, stayed = solve(request_of([slow]), profile), solve(request_of([kept]), profile)
    assert stayed.switch_cost_s == 0 and switched.switch_cost_s > 0.25 * stayed.objective_s
    assert stayed.objective_s < switched.objective_s
    both = request_of([slow, kept])
    raised = switched.model_copy(update={"lower_bound_s": stayed.objective_s * 1.001})
    verification = verify_bound(raised, profile, both)
    assert verification.verified_bound_s <= stayed.objective_s * (1 + 1e-9)
    assert not verification.ok
    assert any(v.startswith("strategy 1x<1,1,1> + 1x<1,3,1>:") for v in verification.violations)


def test_a_pool_plan_verifies_against_the_request_pool() -> None:
    """A pool's space is the request's pool: each member is bounded; without the request the
    verifier cannot know the pool and says so."""
    profile, lengths, num_gpus = random_instance(0)
    pool = [f"{num_gpus}x<1,1,1>", f"{num_gpus // 2}x<2,1,1>"]
    options = SolverOptions(max_schemes=MAX_SCHEMES, strategy_pool=pool, time_limit_s=2)
    request = PlanRequest(lengths=lengths, num_gpus=num_gpus, options=options)
    plan = solve(request, profile)
    assert plan.bound_certificate.space == "pool"
    verification = verify_bound(plan, profile, request)
    assert verification.num_strategies == 2 and verification.verified_bound_s <= plan.objective_s * (1 + 1e-9)
    assert verification.ok, verification.violations
    assert verify_bound(plan, profile).violations == [
        "bound: a pool certificate is verified against the request's pool"
    ]
    raised = plan.model_copy(update={"lower_bound_s": plan.objective_s * 1.5})
    assert any(v.startswith("strategy ") for v in verify_bound(raised, profile, request).violations)
