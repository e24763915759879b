"""The baselines: checked plans, each one's defining restriction, determinism, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.cost_models.analytic import build_profile
from hydraplan.cost_models.catalog import get_gpu, get_model
from hydraplan.planner.baselines import (
    BASELINES,
    INTERLEAVED_BASELINES,
    hydraulis,
    hydraulis_dispatch,
    hydraulis_floor_s,
    hydraulis_give_up,
    hydraulis_pack,
    megatron,
    recipe_chunks,
    recipe_counts_for,
    run_baseline,
    wlb,
)
from hydraplan.planner.check import check_plan
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import CostProfile, PlanRequest, SchemeCost, SolverOptions
from hydraplan.planner.scheme import ParallelScheme

PROFILE = synthetic_profile(max_gpus=16)
NAMES = ["megatron", "wlb", "flexsp", "hydraulis"]
VPP_NAMES = ["megatron-vpp", "wlb-vpp"]


def request(lengths, num_gpus=16, previous_strategy=None, **options) -> PlanRequest:
    return PlanRequest(
        lengths=lengths,
        num_gpus=num_gpus,
        gpus_per_node=8,
        options=SolverOptions(**options),
        previous_strategy=previous_strategy,
    )


def schemes_of(plan) -> set[tuple[int, int, int]]:
    return {(p.scheme.tp, p.scheme.pp, p.scheme.cp) for p in plan.pipelines}


def test_registry_holds_the_four_baselines_and_the_two_interleaved_ones():
    assert sorted(BASELINES) == sorted([*NAMES, *VPP_NAMES])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("num_gpus", [8, 16])
def test_every_baseline_plan_passes_the_checker(name, num_gpus):
    lengths = wikipedia_like_batch(50_000, seed=num_gpus)
    plan = run_baseline(name, request(lengths, num_gpus=num_gpus), PROFILE)
    assert check_plan(plan) == [] and check_plan(plan, PROFILE) == []
    assert plan.solver.backend == f"baseline:{name}"
    placed = sorted(sid for p in plan.pipelines for mb in p.micro_batches for sid in mb.sequence_ids)
    assert placed == list(range(len(lengths)))
    assert 0 < plan.lower_bound_s <= plan.step_time_s


@pytest.mark.parametrize("name", NAMES)
def test_baseline_plans_carry_the_switch_cost_from_a_previous_strategy(name):
    lengths = wikipedia_like_batch(30_000, seed=3)
    # each GPU of 4x<1,4,1> holds a quarter of the layers: every other strategy must load some
    plan = run_baseline(name, request(lengths, previous_strategy="4x<1,4,1>"), PROFILE)
    assert check_plan(plan) == []
    assert plan.previous_strategy == "4x<1,4,1>"
    assert plan.objective_s == pytest.approx(plan.step_time_s + plan.switch_cost_s)
    if plan.strategy != "4x<1,4,1>":
        assert plan.switch_cost_s > 0
    # from whole-model replicas every new shard is already held: the same plan switches for free
    free = run_baseline(name, request(lengths, previous_strategy="16x<1,1,1>"), PROFILE)
    assert check_plan(free) == [] and free.switch_cost_s == 0.0


def test_wlb_is_homogeneous_and_beats_megatron_when_long_documents_arrive_together():
    # Attention-heavy costs (long-context regime) and the four long documents first: Megatron's
    # arrival-order packing puts two of them in each of its first micro-batches, WLB spreads them.
    profile = CostProfile(
        num_layers=8,
        schemes=[SchemeCost(tp=2, pp=2, cp=1, a=1e-8, b=2e-5, c=1e-3, capacity_tokens=16384)],
    )
    lengths = [8000] * 4 + [500] * 256
    baseline, balanced = (
        megatron(request(lengths, num_gpus=8), profile),
        wlb(request(lengths, num_gpus=8), profile),
    )
    assert check_plan(balanced) == []
    assert balanced.strategy == baseline.strategy == "2x<2,2,1>"
    assert balanced.step_time_s < 0.9 * baseline.step_time_s
    assert balanced.plan_id != baseline.plan_id  # same request and strategy, different baselines
    # least micro-batches the capacity allows: ceil(160_000 tokens / (16384 * 2 replicas)) = 5 each
    assert [len(p.micro_batches) for p in balanced.pipelines] == [5, 5]
    # no micro-batch holds two long documents
    assert all(mb.lengths.count(8000) <= 1 for p in balanced.pipelines for mb in p.micro_batches)


def test_wlb_on_the_synthetic_profile_is_no_slower_than_megatron_on_sorted_arrivals():
    # Sorted arrival order (shortest first) concentrates the longest sequences in Megatron's last
    # micro-batches; measured to hold for these batches, not a theorem (see the module docstring).
    for seed in range(2):
        lengths = sorted(wikipedia_like_batch(60_000, seed=seed))
        balanced, baseline = wlb(request(lengths), PROFILE), megatron(request(lengths), PROFILE)
        assert len(schemes_of(balanced)) == 1
        assert balanced.step_time_s <= baseline.step_time_s


def test_flexsp_uses_only_sequence_parallel_groups():
    plan = run_baseline("flexsp", request(wikipedia_like_batch(60_000, seed=7)), PROFILE)
    assert all(tp == 1 and pp == 1 for tp, pp, _ in schemes_of(plan))
    assert check_plan(plan) == []


def test_flexsp_falls_back_to_the_smallest_tp_with_pp_1():
    no_tp1 = PROFILE.model_copy(update={"schemes": [s for s in PROFILE.schemes if s.tp >= 2]})
    plan = run_baseline("flexsp", request(wikipedia_like_batch(40_000, seed=8)), no_tp1)
    assert all(tp == 2 and pp == 1 for tp, pp, _ in schemes_of(plan))
    # a sequence longer than every <1,1,cp> capacity moves FlexSP to the smallest TP that holds it
    longest_tp1 = max(ProfileCostModel(PROFILE).capacity_tokens(ParallelScheme(1, 1, cp)) for cp in (1, 2, 4))
    lengths = wikipedia_like_batch(40_000, seed=8) + [longest_tp1 + 1000]
    plan = run_baseline("flexsp", request(lengths), PROFILE)
    assert check_plan(plan) == [] and all(tp == 2 and pp == 1 for tp, pp, _ in schemes_of(plan))


def test_hydraulis_uses_only_tp_pp_schemes_and_is_deterministic_for_a_seed():
    lengths = wikipedia_like_batch(60_000, seed=9)
    first, second = (
        hydraulis(request(lengths, seed=4), PROFILE),
        hydraulis(request(lengths, seed=4), PROFILE),
    )
    assert all(cp == 1 for _, _, cp in schemes_of(first))
    assert first.model_dump(exclude={"solver"}) == second.model_dump(exclude={"solver"})
    assert first.plan_id != wlb(request(lengths, seed=4), PROFILE).plan_id
    other = hydraulis(request(lengths, seed=5), PROFILE)
    assert check_plan(other) == [] and all(cp == 1 for _, _, cp in schemes_of(other))


def test_hydraulis_dispatch_is_first_fit_under_the_running_maximum_and_drops_idle_shuffles():
    cost = ProfileCostModel(PROFILE)
    coefs = [cost.coefficients(ParallelScheme(1, 1, 1))] * 3
    lengths = np.array([4000, 1000, 1000, 1000])  # work: long ~0.20 s, short ~0.05 s each
    # shuffle 0 (long first): every short fits pipeline 1 under the running max, pipeline 2 idles
    # -> discarded; shuffle 1 (shorts first): one short each, then the long to the least loaded
    shuffles = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    assignment = hydraulis_dispatch(lengths, coefs, shuffles)
    assert [a.tolist() for a in assignment] == [[0, 1], [2], [3]]
    assert hydraulis_dispatch(lengths, coefs, shuffles[:1]) is None


def _hydraulis_case(seed: int):
    """A random batch, a strategy of the synthetic profile's `cp == 1` schemes on up to 16 GPUs
    (mixed or not), its pipelines' coefficients and a random dispatch of the batch over them."""
    rng = np.random.default_rng(seed)
    cost = ProfileCostModel(PROFILE)
    schemes = [s for s in cost.schemes() if s.cp == 1 and s.num_gpus <= 8]
    picked = [schemes[i] for i in rng.choice(len(schemes), size=int(rng.integers(1, 4)))]
    coefs = [cost.coefficients(scheme) for scheme in picked for _ in range(int(rng.integers(1, 3)))]
    lengths = np.array(wikipedia_like_batch(int(rng.integers(20_000, 120_000)), seed=seed))
    lengths = lengths[lengths <= min(coef.capacity_tokens for coef in coefs)]
    owner = rng.integers(0, len(coefs), size=len(lengths))
    owner[: len(coefs)] = np.arange(len(coefs))  # no pipeline empty
    return cost, coefs, lengths, [np.flatnonzero(owner == p) for p in range(len(coefs))]


@pytest.mark.parametrize("seed", range(25))
def test_hydraulis_floors_are_below_every_packing_estimate(seed):
    """The area floor is below the largest pipeline estimate of any dispatch (here random ones),
    and a pipeline whose summed work passes its kind's give-up limit for a target packs to an
    estimate above that target."""
    cost, coefs, lengths, assignment = _hydraulis_case(seed)
    estimates = [hydraulis_pack(members, lengths, coef)[2] for members, coef in zip(assignment, coefs)]
    assert hydraulis_floor_s(lengths, coefs) <= max(estimates) * (1 + 1e-12)
    kinds = list(dict.fromkeys(coefs))
    for members, coef, estimate_s in zip(assignment, coefs, estimates):
        work = float(coef.work_s(lengths[members]).sum())
        for target_s in (0.5 * estimate_s, 0.9 * estimate_s, 0.99 * estimate_s, estimate_s):
            limit = hydraulis_give_up(kinds, target_s)[kinds.index(coef)]
            if work > limit:
                assert estimate_s > target_s * (1 - 1e-12)


def test_hydraulis_give_up_limits_are_tight_where_the_packing_is_even():
    """The limits invert the estimate of an even packing: `W + c` without a pipeline, and
    `(sqrt(W) + sqrt(P c))^2` for P bubbles (what `v = sqrt(P W / c)` even micro-batches give)."""
    cost = ProfileCostModel(PROFILE)
    flat, deep = cost.coefficients(ParallelScheme(1, 1, 1)), cost.coefficients(ParallelScheme(1, 4, 1))
    limits = hydraulis_give_up([flat, deep], 2.0)
    assert limits[0] == pytest.approx(2.0 - flat.c)
    assert (np.sqrt(limits[1]) + np.sqrt(3 * deep.c)) ** 2 == pytest.approx(2.0)
    assert hydraulis_give_up([deep], 3 * deep.c * 0.9)[0] < 0  # the bubbles alone cost more
    assert np.isinf(hydraulis_give_up([flat, deep], np.inf)).all()


@pytest.mark.parametrize("seed", range(12))
def test_hydraulis_choice_is_the_same_without_its_floors(seed, monkeypatch):
    """The floors and the early stops only skip work: the choice (strategy, estimate, every
    micro-batch) is what evaluating every strategy and every shuffle in full gives."""
    import hydraplan.planner.baselines as baselines

    rng = np.random.default_rng(seed)
    num_gpus = int(rng.choice([8, 16]))
    lengths = np.array(wikipedia_like_batch(int(rng.integers(20_000, 200_000)), seed=100 + seed))
    cost = ProfileCostModel(PROFILE)
    coefs = baselines._hydraulis_schemes(cost, num_gpus)

    def choice():
        made = baselines.hydraulis_choice(lengths, cost, coefs, num_gpus, 3, seed).candidate
        return str(made.strategy), made.step_time_s, [[mb.tolist() for mb in p.micro_batches] for p in made.packed]

    pruned = choice()
    monkeypatch.setattr(baselines, "hydraulis_floor_s", lambda *args: 0.0)
    monkeypatch.setattr(baselines, "hydraulis_give_up", lambda kinds, beat_s: np.full(len(kinds), np.inf))
    monkeypatch.setattr(baselines, "first_fit_shuffles", _first_fit_without_stops)
    assert choice() == pruned


def _first_fit_without_stops(work, fits, kind_of, shuffles, give_up):
    """Every shuffle in full: the kernel on one shuffle at a time, so no earlier score stops it."""
    from hydraplan.planner.kernels import first_fit_shuffles

    runs = [first_fit_shuffles(work, fits, kind_of, shuffles[row : row + 1], give_up) for row in range(len(shuffles))]
    return np.concatenate([scores for scores, _ in runs]), np.concatenate([choices for _, choices in runs])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("name", ["megatron", "wlb"])
def test_homogeneous_floors_are_below_every_plan_and_skip_only_slower_ones(name, seed, monkeypatch):
    """Every scheme's plan is at or above its floor, and the choice (strategy, step time, every
    micro-batch) is the one building every scheme gives."""
    import hydraplan.planner.baselines as baselines

    rng = np.random.default_rng(seed)
    num_gpus = int(rng.choice([8, 16]))
    lengths = np.array(wikipedia_like_batch(int(rng.integers(20_000, 300_000)), seed=200 + seed))
    cost = ProfileCostModel(PROFILE)
    build = baselines._megatron_candidate if name == "megatron" else baselines._wlb_candidate
    as_float = lengths.astype(np.float64)
    totals = (float(as_float @ as_float), float(as_float.sum()))
    for coef in baselines._dividing(cost, num_gpus):
        made = build(lengths, coef, num_gpus, cost)
        if made is not None:
            assert baselines._homogeneous_floor_s(coef, num_gpus, totals, cost) <= made.step_time_s * (1 + 1e-12)

    def choice():
        made = baselines.peer_choice(name, lengths, cost, num_gpus, 3, seed).candidate
        return str(made.strategy), made.step_time_s, [[mb.tolist() for mb in p.micro_batches] for p in made.packed]

    skipping = choice()
    monkeypatch.setattr(baselines, "_homogeneous_floor_s", lambda *args: 0.0)
    assert choice() == skipping


def test_hydraulis_packing_minimises_its_pipeline_estimate():
    cost = ProfileCostModel(PROFILE)
    coef = cost.coefficients(ParallelScheme(2, 4, 1))
    lengths = np.array(wikipedia_like_batch(40_000, seed=10))
    members = np.arange(len(lengths))
    micro_batches, times, estimate_s = hydraulis_pack(members, lengths, coef)
    assert sorted(np.concatenate(micro_batches).tolist()) == members.tolist()
    assert all(lengths[mb].sum() <= coef.capacity_tokens for mb in micro_batches)
    assert times == pytest.approx(
        [coef.stage_time_s(float(lengths[mb] @ lengths[mb]), float(lengths[mb].sum())) for mb in micro_batches]
    )
    assert estimate_s == pytest.approx((len(micro_batches) + coef.scheme.pp - 1) * max(times))
    # far better than one micro-batch per sequence (a sanity check of the choice of v)
    per_item = (len(lengths) + 3) * max(coef.stage_time_s(float(n * n), float(n)) for n in lengths)
    assert estimate_s < 0.5 * per_item


def test_unknown_baseline_lists_the_valid_names():
    valid = "flexsp, hydraulis, megatron, megatron-vpp, wlb, wlb-vpp"
    with pytest.raises(PlanningError, match=f"unknown baseline 'nope'; valid: {valid}"):
        run_baseline("nope", request([100] * 20), PROFILE)


@pytest.mark.parametrize("name", NAMES)
def test_a_batch_no_baseline_can_hold_raises_planning_error(name):
    tiny = CostProfile(
        num_layers=8,
        schemes=[SchemeCost(tp=1, pp=1, cp=1, a=1e-10, b=1e-5, c=1e-3, capacity_tokens=4096)],
    )
    with pytest.raises(PlanningError, match=name):  # fewer sequences than the 8 pipelines
        run_baseline(name, request([1000, 2000, 3000], num_gpus=8), tiny)
    with pytest.raises(PlanningError, match="exceed the largest capacity"):
        run_baseline(name, request([1000] * 20 + [10**6]), PROFILE)


@pytest.mark.parametrize("name", ["hydraulis", "flexsp"])
def test_heterogeneous_baselines_consider_every_homogeneous_strategy(name, monkeypatch):
    """Fair baselines: the strategy generators they imitate produce homogeneous strategies, so
    their pools hold each scheme of their space on the whole cluster, besides the mixed ones."""
    import hydraplan.planner.baselines as baselines

    seen: list = []
    real = baselines._hydraulis_choice if name == "hydraulis" else baselines._greedy_dispatch_of

    def recording(strategy, *args):
        seen.append(strategy)
        return real(strategy, *args)

    monkeypatch.setattr(baselines, "_hydraulis_choice" if name == "hydraulis" else "_greedy_dispatch_of", recording)
    lengths = wikipedia_like_batch(30_000, seed=3)
    run_baseline(name, request(lengths), PROFILE)
    pipelines = [strategy.counts for strategy in seen if len(strategy.counts) == 1]
    schemes = {scheme for ((scheme, count),) in pipelines if scheme.num_gpus * count == 16}
    cost = ProfileCostModel(PROFILE)
    if name == "hydraulis":
        expected = {s for s in cost.schemes() if s.cp == 1 and 16 % s.num_gpus == 0}
    else:
        tp = min(s.scheme.tp for s in baselines.flexsp_schemes(cost, 16, max(lengths)))
        expected = {s for s in cost.schemes() if s.pp == 1 and s.tp == tp and 16 % s.num_gpus == 0}
    assert expected and expected <= schemes
    assert len(seen) == len(set(seen))  # no strategy evaluated twice


def test_baseline_plans_are_checked_before_they_are_returned(monkeypatch):
    import hydraplan.planner.baselines as baselines

    monkeypatch.setattr(baselines, "check_plan", lambda plan: ["a planted violation"])
    with pytest.raises(AssertionError, match="baseline megatron produced an invalid plan: a planted violation"):
        run_baseline("megatron", request(wikipedia_like_batch(10_000, seed=1)), PROFILE)


# ---------------------------------------------------------------------------------------------
# megatron-vpp, wlb-vpp: the recipe's interleaved schedule
# ---------------------------------------------------------------------------------------------


def _reference_split_to(groups, lengths, count):
    """`_split_to` as first written: a rescan of every micro-batch for each cut."""
    groups = list(groups)
    while len(groups) < count:
        tokens = [int(lengths[group].sum()) if len(group) > 1 else -1 for group in groups]
        index = int(np.argmax(tokens))
        if tokens[index] < 0:
            return None
        group = groups[index]
        cumulative = np.cumsum(lengths[group])
        cut = int(np.clip(np.searchsorted(cumulative, cumulative[-1] / 2) + 1, 1, len(group) - 1))
        groups[index : index + 1] = [group[:cut], group[cut:]]
    return groups


@pytest.mark.parametrize("seed", range(40))
def test_split_to_cuts_as_the_rescan_did(seed):
    import hydraplan.planner.baselines as baselines

    rng = np.random.default_rng(seed)
    lengths = rng.choice([1, 2, 3, 5, 8], size=int(rng.integers(1, 120)))  # ties of tokens on purpose
    groups = baselines.arrival_order_micro_batches(lengths, int(rng.choice([1, 4, 9, 30, 1000])))
    for count in (len(groups), len(groups) + 1, len(groups) * 2 + 3, len(lengths), len(lengths) + 1):
        made, expected = baselines._split_to(groups, lengths, count), _reference_split_to(groups, lengths, count)
        if expected is None:
            assert made is None
        else:
            assert [group.tolist() for group in made] == [group.tolist() for group in expected]


def test_recipe_chunk_counts_are_those_of_the_nemo_recipes():
    assert recipe_chunks("llama3-70b", 80, 4) == 5  # llama3_70b.py: PP 4, VP 5
    assert recipe_chunks("llama3-405b", 126, 9) == 2  # llama31_405b.py: PP 9, VP 2
    assert recipe_chunks("llama3-8b", 32, 2) == 4  # no recipe: 4 layers a chunk
    assert recipe_chunks("llama3-8b", 32, 8) == 1  # 4 layers a rank: one chunk of 4
    assert recipe_chunks("llama3-8b", 32, 1) == 1  # no pipeline
    assert recipe_chunks("odd", 30, 4) == 1  # layers that do not split evenly over the stages
    assert recipe_counts_for("llama3-8b", 32, 32) == [2, 4]  # pp 2 -> 4, pp 4 -> 2


def _pipelined_8b(interleaved: bool) -> CostProfile:
    """Llama 3 8B on 16 H100 with only its pp 2 schemes (and their v = 4 entries when
    `interleaved`): every homogeneous plan is a pipeline the recipe interleaves."""
    counts = recipe_counts_for("llama3-8b", 32, 16) if interleaved else []
    profile = build_profile(get_model("llama3-8b"), get_gpu("h100-sxm-80gb"), 16, 8, virtual_stages=counts)
    return profile.model_copy(update={"schemes": [entry for entry in profile.schemes if entry.pp == 2]})


@pytest.mark.parametrize("name", VPP_NAMES)
def test_interleaved_baselines_run_the_recipe_chunk_count(name):
    profile = _pipelined_8b(interleaved=True)
    lengths = wikipedia_like_batch(120_000, seed=5, cap=8192)
    plan = run_baseline(name, request(lengths), profile)
    assert check_plan(plan) == [] and check_plan(plan, profile) == []
    assert plan.solver.backend == f"baseline:{name}"
    assert {p.scheme.v for p in plan.pipelines} == {4}  # the recipe's v for pp 2
    assert all(len(p.micro_batches) % p.scheme.pp == 0 for p in plan.pipelines)  # Megatron-Core's rule
    placed = sorted(sid for p in plan.pipelines for mb in p.micro_batches for sid in mb.sequence_ids)
    assert placed == list(range(len(lengths)))
    plain = run_baseline(INTERLEAVED_BASELINES[name], request(lengths), profile)
    assert {p.scheme.v for p in plain.pipelines} == {1}  # the old names keep meaning plain 1F1B
    if name == "megatron-vpp":  # arrival order kept: each micro-batch is a run of consecutive sequences
        for pipeline in plan.pipelines:
            for micro_batch in pipeline.micro_batches:
                ids = sorted(micro_batch.sequence_ids)
                assert ids == list(range(ids[0], ids[0] + len(ids)))


@pytest.mark.parametrize("name", VPP_NAMES)
def test_interleaved_baseline_without_its_schemes_says_how_to_price_them(name):
    lengths = wikipedia_like_batch(60_000, seed=2, cap=8192)
    with pytest.raises(PlanningError, match=r"none of the interleaved schemes.*<\d+,2,\d+,4>.*virtual stages 4"):
        run_baseline(name, request(lengths), _pipelined_8b(interleaved=False))


def test_hydraulis_plans_plain_1f1b_beside_interleaved_entries():
    """The search now offers a profile's interleaved entries as schemes (`runnable_schemes`);
    Hydraulis packs for plain 1F1B and keeps to the plain ones (its plan passed the checker with
    an interleaved pipeline of 9 micro-batches before)."""
    profile = _pipelined_8b(interleaved=True)
    plan = run_baseline("hydraulis", request(wikipedia_like_batch(120_000, seed=5, cap=8192)), profile)
    assert check_plan(plan, profile) == [] and {p.scheme.v for p in plan.pipelines} == {1}


@pytest.mark.parametrize(("model", "seed"), [("llama3-8b", 0), ("llama3-8b", 1), ("llama-32b", 2)])
def test_flexsp_packs_only_dispatches_whose_floor_can_win_and_chooses_as_packing_them_all(monkeypatch, model, seed):
    # flexsp packs its pool's dispatches in the order of their floors and stops at the first floor
    # above the fastest packed: the choice is the one packing every dispatch gives (least step time,
    # first in pool order), with fewer packings
    import hydraplan.planner.baselines as baselines
    from hydraplan.api.datasets import sample_batch

    num_gpus = 64
    cost = ProfileCostModel(build_profile(get_model(model), get_gpu("h100-sxm-80gb"), num_gpus, 8))
    lengths = np.array(sample_batch("wikipedia", 300_000, seed, 16_384))
    coefs = baselines.flexsp_schemes(cost, num_gpus, int(lengths.max()))
    packs = []
    real_pack = baselines.pack_pipeline
    monkeypatch.setattr(baselines, "pack_pipeline", lambda *args: packs.append(1) or real_pack(*args))
    pruned = baselines.flexsp_choice(lengths, cost, coefs, num_gpus, 3)
    pruned_packs = len(packs)
    monkeypatch.setattr(baselines, "_packed_floor_s", lambda *args: -np.inf)
    packs.clear()
    every = baselines.flexsp_choice(lengths, cost, coefs, num_gpus, 3)
    assert pruned.candidate.strategy == every.candidate.strategy
    assert pruned.candidate.step_time_s == every.candidate.step_time_s
    assert pruned_packs < len(packs)
    monkeypatch.undo()
    # the floor is below what packing gives, for every dispatch
    pool = baselines.strategy_pool(lengths, coefs, cost, num_gpus, 3, baselines.FLEXSP_POOL_SIZE)
    for strategy in baselines.with_homogeneous(pool, coefs, num_gpus):
        found = baselines._greedy_dispatch_of(strategy, lengths, cost)
        if found is not None:
            pipeline_coefs, assignment = found
            slowest = max(real_pack(items, lengths, coef).time_s for items, coef in zip(assignment, pipeline_coefs))
            assert baselines._packed_floor_s(assignment, pipeline_coefs, lengths) <= slowest * (1 + 1e-12)
