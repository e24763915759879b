"""End to end against an exhaustive optimum: on random tiny instances (random profiles with pp and
cp > 1, capacities that bind, 4-6 GPUs, at most 6 sequences), `solve`'s bound is at most the true
optimum, the optimum at most its plan, and its plan within 0.5% of the optimum.

The optimum is found by enumeration with the checker's reference costs (planner/reference.py,
written apart from the solver): every strategy of at most `max_schemes` distinct schemes on
exactly the cluster, every assignment of sequences to its pipelines (none idle), and for each
pipeline every ordered partition of its sequences into micro-batches under the capacity, timed by
the reference 1F1B simulation.

Interleaved instances (`random_interleaved_instance`, 12 layers) add to some pp > 1 schemes their
`<tp,pp,cp,2>` entries (per-chunk coefficients with a boundary transfer of their own, a smaller
capacity): the search chooses v among them, and the enumeration times an interleaved pipeline by
the reference interleaved schedule over every partition into a multiple of pp micro-batches.

`HYDRAPLAN_EXHAUSTIVE_OPTIMA=FILE` keeps the optima in FILE between runs, keyed by the instance and
by the source of this file and of planner/reference.py (the only code they depend on): the
mutation run of the bound code (`benchmarks/mutation.py --targets bounds`) shares them between its
mutants instead of enumerating again for each.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from hydraplan.planner import reference
from hydraplan.planner.check import check_plan
from hydraplan.planner.schemas import CostProfile, PlanRequest, SchemeCost, SolverOptions
from hydraplan.planner.solve import solve

NUM_CASES = 50
MAX_SCHEMES = 2
NUM_INTERLEAVED_CASES = 16
# outside the slow marker (~1 s of CPU in all): the optimum of case 2 runs plain pipelines only, those
# of 4, 6 and 15 an interleaved one
QUICK_INTERLEAVED_CASES = (2, 4, 6, 15)


def random_instance(case: int) -> tuple[CostProfile, list[int], int]:
    rng = np.random.default_rng(1000 + case)
    num_gpus = int(rng.integers(4, 7))
    shapes = [(tp, pp, cp) for tp in (1, 2) for pp in (1, 2, 3) for cp in (1, 2) if tp * pp * cp <= num_gpus]
    chosen = rng.choice(len(shapes), size=min(len(shapes), int(rng.integers(2, 5))), replace=False)
    if not any(shapes[index][0] * shapes[index][1] * shapes[index][2] == 1 for index in chosen):
        chosen = [*chosen, shapes.index((1, 1, 1))]  # so that every cluster size can be covered
    schemes = []
    for index in sorted(int(i) for i in chosen):
        tp, pp, cp = shapes[index]
        shards = tp * cp
        schemes.append(
            SchemeCost(
                tp=tp,
                pp=pp,
                cp=cp,
                a=float(rng.uniform(0.5, 2.0)) * 1e-9 / shards / pp,
                b=float(rng.uniform(0.5, 2.0)) * 1e-5 / shards / pp,
                c=float(rng.uniform(0.5, 3.0)) * 1e-3,
                fwd_fraction=float(rng.choice([1 / 3, 0.4])),
                capacity_tokens=int(rng.integers(2500, 4500)) * shards,
                grad_bytes_per_gpu=float(rng.uniform(1e8, 1e9)) / (tp * pp),
            )
        )
    profile = CostProfile(num_layers=6, schemes=schemes, grad_sync_bandwidth_bytes_per_s=5e10)
    lengths = rng.integers(100, 2400, size=int(rng.integers(4, 7))).tolist()
    return profile, lengths, num_gpus


def random_interleaved_instance(case: int) -> tuple[CostProfile, list[int], int]:
    """A tiny instance whose profile also prices `<tp,pp,cp,2>` for some of its pp > 1 schemes: a
    chunk does half the stage's work plus its own boundary transfer (`b` and `c` per chunk), with
    the capacity a little smaller (more micro-batches in flight). Deep pipelines with a large `c`
    make the interleaved bubble pay for its extra transfers on some instances, not on others."""
    rng = np.random.default_rng(5000 + case)
    num_gpus = int(rng.integers(4, 7))
    shapes = [(tp, pp, 1) for tp in (1, 2) for pp in (1, 2, 3) if tp * pp <= num_gpus]
    chosen = {int(i) for i in rng.choice(len(shapes), size=min(len(shapes), int(rng.integers(2, 4))), replace=False)}
    chosen.add(shapes.index((1, 1, 1)))  # so that every cluster size can be covered
    if not any(shapes[index][1] > 1 for index in chosen):
        chosen.add(shapes.index((1, 2, 1)))
    schemes = []
    for index in sorted(chosen):
        tp, pp, cp = shapes[index]
        plain = SchemeCost(
            tp=tp,
            pp=pp,
            cp=cp,
            a=float(rng.uniform(0.5, 2.0)) * 1e-9 / tp / pp,
            b=float(rng.uniform(0.5, 2.0)) * 1e-5 / tp / pp,
            c=float(rng.uniform(1.0, 6.0)) * 1e-3,
            fwd_fraction=float(rng.choice([1 / 3, 0.4])),
            capacity_tokens=int(rng.integers(2500, 4500)) * tp,
            grad_bytes_per_gpu=float(rng.uniform(1e8, 1e9)) / (tp * pp),
        )
        schemes.append(plain)
        if pp > 1 and rng.uniform() < 0.8:
            transfer_s = float(rng.uniform(0.0, 0.3)) * plain.c
            schemes.append(
                plain.model_copy(
                    update={
                        "v": 2,
                        "a": plain.a / 2,
                        "b": plain.b / 2 + float(rng.uniform(0.0, 0.05)) * plain.b,
                        "c": plain.c / 2 + transfer_s,
                        "capacity_tokens": int(plain.capacity_tokens * float(rng.uniform(0.7, 1.0))),
                    }
                )
            )
    profile = CostProfile(num_layers=12, schemes=schemes, grad_sync_bandwidth_bytes_per_s=5e10)
    lengths = rng.integers(100, 2400, size=int(rng.integers(4, 7))).tolist()
    return profile, lengths, num_gpus


def ordered_partitions(items: tuple[int, ...], fits=lambda block: True):
    """Every sequence of disjoint non-empty blocks covering `items` (execution order matters),
    each block one that `fits` accepts."""
    if not items:
        yield ()
        return
    for size in range(len(items), 0, -1):  # fewest blocks first: they tend to be the fastest
        for block in itertools.combinations(items, size):
            if not fits(block):
                continue
            rest = tuple(item for item in items if item not in block)
            for tail in ordered_partitions(rest, fits):
                yield (block, *tail)


def exhaustive_optimum_s(profile: CostProfile, lengths: list[int], num_gpus: int) -> float:
    entries = reference.scheme_entries(profile)

    @cache
    def best_pipeline_s(scheme: reference.Scheme, members: tuple[int, ...]) -> float:
        entry = entries[scheme]
        capacity = reference.capacity_tokens(profile, entry)
        best = float("inf")
        for blocks in ordered_partitions(members, lambda block: sum(lengths[i] for i in block) <= capacity):
            if entry.v > 1 and len(blocks) % entry.pp:
                continue  # interleaved: a multiple of pp micro-batches (Megatron-Core's groups of pp)
            batches = [[lengths[i] for i in block] for block in blocks]
            times = [reference.stage_time_s(profile, entry, batch) for batch in batches]
            if sum(times) >= best:  # one stage runs every micro-batch in turn: no better than that
                continue
            if entry.v > 1:
                time_s = reference.interleaved_pipeline_time_s(times, entry.pp, entry.v, entry.fwd_fraction, entry.pp)
            else:
                time_s = reference.pipeline_time_s(times, entry.pp, entry.fwd_fraction)
            best = min(best, time_s)
        return best

    @cache
    def best_split_s(schemes: tuple[reference.Scheme, ...], members: frozenset[int]) -> float:
        """The least slowest-pipeline time of `members` split over pipelines of `schemes`, each
        pipeline given at least one sequence: the first takes every non-empty subset in turn."""
        if not schemes:
            return 0.0 if not members else float("inf")
        if len(members) < len(schemes):
            return float("inf")
        best = float("inf")
        ordered = sorted(members)
        for size in range(1, len(ordered) + 1):
            for taken in itertools.combinations(ordered, size):
                rest = best_split_s(schemes[1:], members.difference(taken))
                if rest < best:  # else this split cannot beat the best one found
                    best = min(best, max(best_pipeline_s(schemes[0], taken), rest))
        return best

    everything = frozenset(range(len(lengths)))
    return min(
        best_split_s(strategy, everything) + reference.grad_sync_s(profile, strategy)
        for strategy in strategies(list(entries), num_gpus)
    )


def strategies(schemes: list[reference.Scheme], num_gpus: int) -> list[tuple[reference.Scheme, ...]]:
    """Every multiset of at most MAX_SCHEMES distinct schemes using exactly `num_gpus` GPUs."""
    found = []
    for distinct in range(1, MAX_SCHEMES + 1):
        for combo in itertools.combinations(schemes, distinct):
            sizes = [scheme[0] * scheme[1] * scheme[2] for scheme in combo]
            ranges = [range(1, num_gpus // size + 1) for size in sizes]
            for counts in itertools.product(*ranges):
                if sum(count * size for count, size in zip(counts, sizes)) == num_gpus:
                    found.append(tuple(s for s, count in zip(combo, counts) for _ in range(count)))
    return found


def optimum_s(profile: CostProfile, lengths: list[int], num_gpus: int) -> float:
    """`exhaustive_optimum_s`, read from `HYDRAPLAN_EXHAUSTIVE_OPTIMA` when it holds this instance
    under the current code, else enumerated (and written there when that is set)."""
    store = os.environ.get("HYDRAPLAN_EXHAUSTIVE_OPTIMA")
    if not store:
        return exhaustive_optimum_s(profile, lengths, num_gpus)
    digest = hashlib.sha256()
    for source in (Path(__file__), Path(reference.__file__)):
        digest.update(source.read_bytes())
    digest.update(json.dumps([profile.model_dump(mode="json"), lengths, num_gpus], sort_keys=True).encode())
    key, path = digest.hexdigest(), Path(store)
    known = json.loads(path.read_text()) if path.is_file() else {}
    if key not in known:
        known[key] = exhaustive_optimum_s(profile, lengths, num_gpus)
        path.write_text(json.dumps(known))
    return known[key]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(NUM_CASES))
def test_bound_optimum_and_plan_against_exhaustive_search(case: int) -> None:
    profile, lengths, num_gpus = random_instance(case)
    optimum = optimum_s(profile, lengths, num_gpus)
    assert optimum < float("inf")
    options = SolverOptions(time_limit_s=5, max_schemes=MAX_SCHEMES)
    plan = solve(PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=options), profile)
    assert check_plan(plan) == []
    assert plan.lower_bound_s <= optimum * (1 + 1e-9), (plan.lower_bound_s, optimum)
    assert optimum <= plan.objective_s * (1 + 1e-9)
    assert plan.objective_s <= optimum * 1.005, (plan.strategy, plan.objective_s, optimum)


def assert_against_exhaustive(profile: CostProfile, lengths: list[int], num_gpus: int) -> object:
    optimum = optimum_s(profile, lengths, num_gpus)
    assert optimum < float("inf")
    options = SolverOptions(time_limit_s=5, max_schemes=MAX_SCHEMES)
    plan = solve(PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=options), profile)
    assert check_plan(plan) == []
    assert plan.lower_bound_s <= optimum * (1 + 1e-9), (plan.lower_bound_s, optimum)
    assert optimum <= plan.objective_s * (1 + 1e-9)
    assert plan.objective_s <= optimum * 1.005, (plan.strategy, plan.objective_s, optimum)
    return plan


@pytest.mark.parametrize("case", QUICK_INTERLEAVED_CASES)
def test_interleaved_bound_optimum_and_plan_against_exhaustive_search(case: int) -> None:
    assert_against_exhaustive(*random_interleaved_instance(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(set(range(NUM_INTERLEAVED_CASES)) - set(QUICK_INTERLEAVED_CASES)))
def test_interleaved_against_exhaustive_search_slow(case: int) -> None:
    assert_against_exhaustive(*random_interleaved_instance(case))


def test_interleaved_instances_choose_v_both_ways() -> None:
    """The quick interleaved instances are not all won by one schedule: the brute-forced optimum of
    some runs an interleaved pipeline and of the other only plain ones (so they test the choice)."""
    winners = [interleaved_wins(*random_interleaved_instance(case)) for case in QUICK_INTERLEAVED_CASES]
    assert winners == [False, True, True, True], winners


def interleaved_wins(profile: CostProfile, lengths: list[int], num_gpus: int) -> bool:
    """Whether the optimum over every scheme beats the optimum over the plain ones alone."""
    plain = profile.model_copy(update={"schemes": [entry for entry in profile.schemes if entry.v == 1]})
    return optimum_s(profile, lengths, num_gpus) < optimum_s(plain, lengths, num_gpus) * (1 - 1e-9)
