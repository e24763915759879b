"""Baselines the planner is compared against.

Every baseline returns a checked-format `Plan` built by `planner.build.build_plan`: its reported
times are the exact 1F1B simulation of the micro-batches it chose, whatever estimate drove its
choices. Each is deterministic for `request.options.seed`.

`megatron`: the fixed layout of Megatron-LM style training — one homogeneous scheme for every
data-parallel replica (the best one for this batch, chosen by simulated step time), sequences
packed in arrival order into micro-batches up to the capacity (token-count packing), and the
micro-batches dealt round-robin to the replicas.

`wlb` (after WLB-LLM, Wang et al. 2025, arXiv 2503.17924): the same homogeneous layout, but
workload-balanced packing: sequences, heaviest first, each go to the micro-batch (over all
replicas' micro-batches) with the least stage time that still has token room; the number of
micro-batches per replica is the least the capacity allows. Each replica's micro-batches are then
ordered by the 1F1B simulation as `planner.packing` does.

`megatron-vpp` and `wlb-vpp`: the same two, with every pipeline of more than one stage run the
way Megatron-LM's users run it, interleaved 1F1B (Narayanan et al. 2021 §2.2) with the chunk count
of the model's published recipe (`recipe_chunks`): micro-batches per replica a multiple of pp
(Megatron-Core's default `microbatch_group_size_per_vp_stage = pp`, `simulate.interleaved_count_ok`),
times from `simulate.pipeline_time_s`. The plain names keep their meaning (plain 1F1B), so older
outputs stay comparable. They need the profile's interleaved entries of those chunk counts
(`recipe_chunk_counts` lists them for `build_profile(virtual_stages=...)`); a scheme whose entry is
missing (its layers do not split into pp x v chunks, or it does not fit in memory interleaved) runs
plain, as a user who cannot interleave it would.

`flexsp` (after FlexSP, Wang et al. ASPLOS 2025, arXiv 2412.01523): heterogeneous
sequence-parallel-only groups — schemes `<1,1,cp>`; when the profile has none, or none holds the
longest sequence, the `pp == 1` schemes of the smallest TP that does — with hydraplan's own greedy
dispatch and packing; the group multiset is the best by simulated step time among a bounded pool.

`hydraulis` (after Hydraulis, Li, Fu et al. 2024, arXiv 2412.07894, and its code, PKU-DAIR/Hetu
`examples/hydraulis`): TP x PP heterogeneous pipelines (`cp == 1`); randomised first-fit dispatch
over 50 seeded shuffles, then per-pipeline packing into the `v` micro-batches that minimise the
estimate `(v + pp - 1) * max(micro-batch time)`; the strategy is the best of a bounded pool (40,
fewer for batches of over 6K sequences) by that estimate, as its code chooses, and the plan reports
the simulated time of what it chose. A strategy (or a shuffle) whose estimate a floor shows cannot
come in below the best so far is not finished (`hydraulis_floor_s`, `hydraulis_give_up`): the
same choice for less work.

The pools of `flexsp` and `hydraulis` hold every homogeneous strategy of their schemes (one scheme
on all GPUs: the strategy generators they imitate produce those, and hydraplan's own search always
tries them), then the strategies hydraplan's search meets first: scheme sets by their fluid lower
bound (`planner.bounds`), pipeline counts nearest the fluid optimum. Every baseline plan passes
`planner.check` before it is returned, like hydraplan's own.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.planner.bounds import BoundTables, sync_lower_bound_s
from hydraplan.planner.build import build_plan, identified, request_hash
from hydraplan.planner.candidate import Candidate
from hydraplan.planner.check import check_plan
from hydraplan.planner.cost import ProfileCostModel, SchemeCoefficients
from hydraplan.planner.dispatch import greedy_dispatch, pipeline_kinds
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.items import Items, prepare_items
from hydraplan.planner.kernels import first_fit_shuffles, next_fit_starts
from hydraplan.planner.packing import PackedPipeline, balance_lpt, best_order, by_length_descending, pack_pipeline
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SolverStats
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.search import placeable_profile, runnable_schemes
from hydraplan.planner.simulate import pipeline_time_s, simulate_1f1b
from hydraplan.planner.strategies import Strategy, count_vectors, parse_strategy
from hydraplan.planner.switching import pipeline_blocks, require_switch_pricing, switch_cost_s

FLEXSP_POOL_SIZE = 24
HYDRAULIS_POOL_SIZE = 40
HYDRAULIS_MIN_POOL_SIZE = 8
HYDRAULIS_DISPATCH_BUDGET = 250_000  # sequences x strategies dispatched (x 50 shuffles each)
HYDRAULIS_SHUFFLES = 50
HYDRAULIS_PACKINGS_PER_PIPELINE = 5
COUNTS_PER_SCHEME_SET = 3
# a floor (flexsp's packing floor, megatron's and wlb's per scheme, hydraulis's) rules a choice out
# only where it clears the time to beat by this share: it adds the same works in another order
FLOOR_SLACK = 1e-9
FALLBACK_COUNT_VECTORS = 256

# Megatron-LM's `--num-layers-per-virtual-pipeline-stage` as NVIDIA's NeMo pretraining recipes set
# it (https://github.com/NVIDIA/NeMo, nemo/collections/llm/recipes, 2024-25): llama3_70b.py runs
# TP 4, PP 4, VP 5 (80 layers: 4 a chunk), llama31_405b.py TP 8, PP 9, VP 2 (126 layers: 7 a
# chunk), gpt3_175b.py TP 4, PP 8, VP 6 (96 layers: 2 a chunk); the 8B recipes run no pipeline.
RECIPE_LAYERS_PER_CHUNK = {"llama3-70b": 4, "llama3-405b": 7}
DEFAULT_LAYERS_PER_CHUNK = 4  # the middle of those three recipes (2, 4, 7), for models without one
INTERLEAVED_BASELINES = {"megatron-vpp": "megatron", "wlb-vpp": "wlb"}  # name -> the plain baseline


@dataclass(frozen=True)
class PeerChoice:
    """A baseline's choice for one batch: its plan as a solver candidate (None when it cannot
    plan the batch) and how much it searched."""

    candidate: Candidate | None
    num_schemes: int
    num_strategies: int
    num_solved: int


# ---------------------------------------------------------------------------------------------
# the recipes' chunk counts (megatron-vpp, wlb-vpp)
# ---------------------------------------------------------------------------------------------


def recipe_chunks(model: str | None, num_layers: int, pp: int) -> int:
    """The model chunks per GPU `v` a Megatron-LM user runs a `pp`-stage pipeline of this model
    with: the divisor of `num_layers / pp` whose chunks (`num_layers / (pp v)` layers) come nearest
    the recipe's layers per chunk (`RECIPE_LAYERS_PER_CHUNK`, else `DEFAULT_LAYERS_PER_CHUNK`),
    larger chunks on ties (fewer point-to-point hops); 1 (plain 1F1B) for pp 1 or layers that do
    not split evenly over the stages. Llama 3 70B at pp 4 gives the recipe's 5, Llama 3 405B at pp 9
    the recipe's 2."""
    if pp <= 1 or num_layers % pp:
        return 1
    per_rank = num_layers // pp
    target = RECIPE_LAYERS_PER_CHUNK.get(model or "", DEFAULT_LAYERS_PER_CHUNK)
    divisors = [v for v in range(1, per_rank + 1) if per_rank % v == 0]
    return min(divisors, key=lambda v: (abs(per_rank / v - target), v))


def recipe_chunk_counts(model: str | None, num_layers: int, pps: Sequence[int]) -> list[int]:
    """The chunk counts (> 1) `recipe_chunks` gives over these pipeline depths: what a profile
    needs priced (`build_profile(virtual_stages=...)`) for `megatron-vpp` and `wlb-vpp`."""
    return sorted({recipe_chunks(model, num_layers, pp) for pp in pps} - {1})


def recipe_counts_for(model: str | None, num_layers: int, num_gpus: int) -> list[int]:
    """`recipe_chunk_counts` over every pipeline depth up to `num_gpus` that splits the layers."""
    depths = [pp for pp in range(2, min(num_layers, num_gpus) + 1) if num_layers % pp == 0]
    return recipe_chunk_counts(model, num_layers, depths)


def wants_interleaved(names: Sequence[str | None]) -> bool:
    """Whether any of these baseline names is an interleaved one (`megatron-vpp`, `wlb-vpp`)."""
    return any(name in INTERLEAVED_BASELINES for name in names)


def recipe_scheme(profile: CostProfile, scheme: ParallelScheme) -> ParallelScheme:
    """`scheme` with the recipe's chunk count (`recipe_chunks`)."""
    v = recipe_chunks(profile.model, profile.num_layers, scheme.pp)
    return scheme if v == 1 else ParallelScheme(scheme.tp, scheme.pp, scheme.cp, v)


def _interleaved_dividing(
    cost: ProfileCostModel, num_gpus: int
) -> tuple[list[SchemeCoefficients], list[ParallelScheme]]:
    """`_dividing`'s schemes, each with its recipe's chunk count where the profile prices that
    interleaved scheme (plain otherwise), and the interleaved schemes the recipe asks for that the
    profile lacks."""
    chosen, missing = [], []
    for coef in _dividing(cost, num_gpus):
        scheme = recipe_scheme(cost.profile, coef.scheme)
        if scheme.v > 1 and not cost.knows(scheme):
            missing.append(scheme)
        chosen.append(cost.coefficients(scheme) if cost.knows(scheme) else coef)
    return chosen, missing


def _split_to(groups: list[np.ndarray], lengths: np.ndarray, count: int) -> list[np.ndarray] | None:
    """Arrival-order micro-batches cut until there are `count`: the one of most tokens (of two or
    more sequences; the first on ties) splits where its tokens are halved, keeping the order. None
    when every micro-batch holds one sequence first.

    The micro-batches that can split wait in a heap by (most tokens, place); a place is a tuple
    (a split's halves extend their parent's by 0 and 1), so places compare in the list's order
    (a rescan of every micro-batch per cut took 7.8 s at 8B / 4,096 H100)."""
    placed = [((index,), group) for index, group in enumerate(groups)]
    splittable = [(-int(lengths[group].sum()), place, group) for place, group in placed if len(group) > 1]
    heapq.heapify(splittable)
    final = [(place, group) for place, group in placed if len(group) <= 1]
    while len(final) + len(splittable) < count:
        if not splittable:
            return None
        _, place, group = heapq.heappop(splittable)
        cumulative = np.cumsum(lengths[group])
        cut = int(np.clip(np.searchsorted(cumulative, cumulative[-1] / 2) + 1, 1, len(group) - 1))
        for half, part in enumerate((group[:cut], group[cut:])):
            if len(part) > 1:
                heapq.heappush(splittable, (-int(lengths[part].sum()), (*place, half), part))
            else:
                final.append(((*place, half), part))
    final.extend((place, group) for _, place, group in splittable)
    return [group for _, group in sorted(final, key=lambda entry: entry[0])]


# ---------------------------------------------------------------------------------------------
# megatron
# ---------------------------------------------------------------------------------------------


def arrival_order_micro_batches(lengths: np.ndarray, capacity_tokens: int) -> list[np.ndarray]:
    """Next-fit in arrival order: a new micro-batch starts when the next item does not fit
    (`kernels.next_fit_starts`)."""
    if len(lengths) == 0:
        return [np.zeros(0, dtype=np.int64)]
    starts = next_fit_starts(lengths.astype(np.float64), float(capacity_tokens)).tolist()
    indices = np.arange(len(lengths), dtype=np.int64)
    return [indices[start:end] for start, end in zip(starts, [*starts[1:], len(lengths)])]


def _megatron_candidate(
    lengths: np.ndarray, coef: SchemeCoefficients, num_gpus: int, cost: ProfileCostModel
) -> Candidate | None:
    num_replicas = num_gpus // coef.scheme.num_gpus
    if num_replicas * coef.scheme.num_gpus != num_gpus or lengths.max() > coef.capacity_tokens:
        return None
    batches = arrival_order_micro_batches(lengths, coef.capacity_tokens)
    if coef.scheme.v > 1:  # interleaved: every replica runs a multiple of pp micro-batches
        step = num_replicas * coef.scheme.pp
        split = _split_to(batches, lengths, step * math.ceil(len(batches) / step))
        if split is None:
            return None
        batches = split
    if len(batches) < num_replicas:
        return None
    packed = []
    for replica in range(num_replicas):
        mine = batches[replica::num_replicas]
        times = [coef.micro_batch_time_s(lengths[b]) for b in mine]
        packed.append(PackedPipeline(tuple(mine), tuple(times), pipeline_time_s(times, coef.scheme, coef.fwd_fraction)))
    return _homogeneous_candidate(coef, num_replicas, packed, cost)


def megatron(request: PlanRequest, profile: CostProfile) -> Plan:
    """The best homogeneous arrival-order plan (see module docstring)."""
    return _best_homogeneous("megatron", request, profile, _megatron_candidate)


# ---------------------------------------------------------------------------------------------
# wlb
# ---------------------------------------------------------------------------------------------


def _wlb_candidate(
    lengths: np.ndarray, coef: SchemeCoefficients, num_gpus: int, cost: ProfileCostModel
) -> Candidate | None:
    num_replicas = num_gpus // coef.scheme.num_gpus
    if num_replicas * coef.scheme.num_gpus != num_gpus or lengths.max() > coef.capacity_tokens:
        return None
    if len(lengths) < num_replicas:
        return None
    order = by_length_descending(np.arange(len(lengths), dtype=np.int64), lengths)
    sub_lengths = lengths[order].astype(np.float64)
    per_replica = max(1, math.ceil(float(sub_lengths.sum()) / (coef.capacity_tokens * num_replicas)))
    step = coef.scheme.pp if coef.scheme.v > 1 else 1  # interleaved: a multiple of pp per replica
    per_replica = step * math.ceil(per_replica / step)
    while True:
        # terminates: with at least one micro-batch per item, every item finds an empty one
        balanced = balance_lpt(sub_lengths, per_replica * num_replicas, coef)
        if balanced is not None:
            break
        per_replica += step
    bins, times = balanced
    if len(bins) < num_replicas or (step > 1 and len(bins) < per_replica * num_replicas):
        return None  # too few sequences for a micro-batch each
    packed = []
    for replica in range(num_replicas):
        # micro-batch k goes to replica k mod R: each replica gets balanced micro-batches
        mine = range(replica, len(bins), num_replicas)
        packed.append(best_order([order[bins[k]] for k in mine], [times[k] for k in mine], coef))
    return _homogeneous_candidate(coef, num_replicas, packed, cost)


def wlb(request: PlanRequest, profile: CostProfile) -> Plan:
    """The best homogeneous workload-balanced plan (see module docstring)."""
    return _best_homogeneous("wlb", request, profile, _wlb_candidate)


def megatron_vpp(request: PlanRequest, profile: CostProfile) -> Plan:
    """`megatron` with its pipelines interleaved as the model's recipe runs them (module docstring)."""
    return _best_homogeneous("megatron-vpp", request, profile, _megatron_candidate, interleaved=True)


def wlb_vpp(request: PlanRequest, profile: CostProfile) -> Plan:
    """`wlb` with its pipelines interleaved as the model's recipe runs them (module docstring)."""
    return _best_homogeneous("wlb-vpp", request, profile, _wlb_candidate, interleaved=True)


# ---------------------------------------------------------------------------------------------
# flexsp
# ---------------------------------------------------------------------------------------------


def flexsp_schemes(cost: ProfileCostModel, num_gpus: int, longest: int) -> list[SchemeCoefficients]:
    """FlexSP's space: the `pp == 1` schemes that fit the cluster with the smallest TP (`<1,1,cp>`
    when the profile has them) whose largest capacity holds the `longest` sequence, or, when no TP
    does, with the TP of the largest capacity."""
    no_pp = [cost.coefficients(s) for s in cost.schemes() if s.pp == 1 and s.num_gpus <= num_gpus]
    if not no_pp:
        return []
    reach: dict[int, int] = {}
    for coef in no_pp:
        reach[coef.scheme.tp] = max(reach.get(coef.scheme.tp, 0), coef.capacity_tokens)
    holding = [tp for tp, capacity in reach.items() if capacity >= longest]
    tp = min(holding) if holding else min(reach, key=lambda tp: (-reach[tp], tp))
    return sorted((coef for coef in no_pp if coef.scheme.tp == tp), key=lambda coef: coef.scheme)


def flexsp(request: PlanRequest, profile: CostProfile) -> Plan:
    """Sequence-parallel-only heterogeneous groups with hydraplan's dispatch and packing."""
    cost = ProfileCostModel(profile)
    coefs = flexsp_schemes(cost, request.num_gpus, max(request.lengths))
    if not coefs:
        raise PlanningError(f"flexsp: no scheme of the profile with pp == 1 fits {request.num_gpus} GPUs")
    items = _items_for("flexsp", request, coefs)
    choice = flexsp_choice(items.lengths, cost, coefs, request.num_gpus, request.options.max_schemes)
    if choice.candidate is None:
        raise PlanningError(
            f"flexsp: no strategy of sequence-parallel groups {_names(coefs)} on "
            f"{request.num_gpus} GPUs can hold the {len(items)} sequences "
            "(fewer sequences than groups, or capacities too small)"
        )
    return _plan("flexsp", request, profile, cost, items, choice)


def flexsp_choice(
    lengths: np.ndarray, cost: ProfileCostModel, coefs: list[SchemeCoefficients], num_gpus: int, max_schemes: int
) -> PeerChoice:
    """FlexSP's best strategy over its schemes `coefs` (`flexsp_schemes`), by simulated step time
    (see module docstring)."""
    if not coefs:
        return PeerChoice(None, 0, 0, 0)
    pool = strategy_pool(lengths, coefs, cost, num_gpus, max_schemes, FLEXSP_POOL_SIZE)
    pool = with_homogeneous(pool, coefs, num_gpus)
    # The first strictly fastest in pool order, as trying them in that order finds it: the least
    # (step time, position). Each dispatch is packed in the order of its floor (`_packed_floor_s`),
    # and none whose floor is above the fastest packed so far: its packing cannot be faster
    # (flexsp's CPU over 28 batches of 8B / 64 to 8B / 1,024 H100: 2.85 -> 1.27 s, the same choices)
    dispatched = []
    for position, strategy in enumerate(pool):
        found = _greedy_dispatch_of(strategy, lengths, cost)
        if found is not None:
            coefs_here, assignment = found
            floor_s = _packed_floor_s(assignment, coefs_here, lengths) + cost.grad_sync_s(strategy.pipeline_schemes())
            dispatched.append((floor_s, position, strategy, coefs_here, assignment))
    best: tuple[float, int, Candidate] | None = None
    for floor_s, position, strategy, coefs_here, assignment in sorted(dispatched, key=lambda entry: entry[:2]):
        if best is not None and floor_s * (1 - FLOOR_SLACK) > best[0]:
            break  # this floor and every later one is above the fastest: none can beat it
        packed = tuple(pack_pipeline(items, lengths, coef) for items, coef in zip(assignment, coefs_here, strict=True))
        candidate = _candidate(strategy, coefs_here, packed, cost)
        if best is None or (candidate.step_time_s, position) < best[:2]:
            best = (candidate.step_time_s, position, candidate)
    return PeerChoice(None if best is None else best[2], len(coefs), len(pool), len(pool))


def _greedy_dispatch_of(
    strategy: Strategy, lengths: np.ndarray, cost: ProfileCostModel
) -> tuple[tuple[SchemeCoefficients, ...], list[np.ndarray]] | None:
    """hydraplan's greedy dispatch on one strategy: its pipelines' coefficients and items; None if
    it cannot hold the items or a pipeline stays empty."""
    coefs = tuple(cost.coefficients(scheme) for scheme in strategy.pipeline_schemes())
    if len(lengths) < len(coefs) or lengths.max() > max(coef.capacity_tokens for coef in coefs):
        return None
    assignment = greedy_dispatch(lengths, coefs)
    return None if assignment is None else (coefs, assignment)


def _packed_floor_s(
    assignment: Sequence[np.ndarray], coefs: Sequence[SchemeCoefficients], lengths: np.ndarray
) -> float:
    """No packing of this dispatch runs its slowest pipeline faster: a pipeline's stage 0 runs all
    its items' work W and the overhead c of at least `ceil(tokens / capacity)` micro-batches (the
    fewest `pack_pipeline` tries), `W + c m` (1F1B and interleaved alike, whose stage times price a
    rank's v chunks)."""
    slowest = 0.0
    for items, coef in zip(assignment, coefs, strict=True):
        if len(items):
            chosen = lengths[items].astype(np.float64)
            slowest = max(slowest, _stage_floor_s(coef, float(chosen @ chosen), float(chosen.sum())))
    return slowest


def _stage_floor_s(coef: SchemeCoefficients, sum_sq: float, tokens: float) -> float:
    """What a pipeline's stage 0 runs at least for items of these totals (sum of squared lengths,
    tokens): their work and the overhead c of the fewest micro-batches they fill, `W + c m`."""
    fewest = max(1, math.ceil(tokens / coef.capacity_tokens))
    return coef.a * sum_sq + coef.b * tokens + coef.c * fewest


# ---------------------------------------------------------------------------------------------
# hydraulis
# ---------------------------------------------------------------------------------------------


def hydraulis(request: PlanRequest, profile: CostProfile) -> Plan:
    """TP x PP heterogeneous pipelines, randomised dispatch and `(v + pp - 1) * max` packing."""
    cost = ProfileCostModel(profile)
    coefs = _hydraulis_schemes(cost, request.num_gpus)
    if not coefs:
        raise PlanningError(f"hydraulis: no scheme of the profile with cp == 1 fits {request.num_gpus} GPUs")
    items = _items_for("hydraulis", request, coefs)
    options = request.options
    choice = hydraulis_choice(items.lengths, cost, coefs, request.num_gpus, options.max_schemes, options.seed)
    if choice.candidate is None:
        raise PlanningError(
            f"hydraulis: no TP x PP strategy over {_names(coefs)} on {request.num_gpus} GPUs can "
            f"hold the {len(items)} sequences "
            "(every shuffle left a pipeline without sequences, or capacities too small)"
        )
    return _plan("hydraulis", request, profile, cost, items, choice)


def _hydraulis_schemes(cost: ProfileCostModel, num_gpus: int) -> list[SchemeCoefficients]:
    """TP x PP schemes of plain 1F1B (Hydraulis plans and packs for 1F1B: a profile's interleaved
    entries, which `runnable_schemes` offers the search, are not its)."""
    return [coef for coef in runnable_schemes(cost, num_gpus) if coef.scheme.cp == 1 and coef.scheme.v == 1]


def hydraulis_choice(
    lengths: np.ndarray,
    cost: ProfileCostModel,
    coefs: list[SchemeCoefficients],
    num_gpus: int,
    max_schemes: int,
    seed: int,
) -> PeerChoice:
    """Hydraulis's best strategy over its schemes `coefs` (`_hydraulis_schemes`) by its own
    estimate, with the exact 1F1B times of what it chose (see module docstring)."""
    if not coefs or lengths.max() > max(coef.capacity_tokens for coef in coefs):
        return PeerChoice(None, len(coefs), 0, 0)
    # dispatch costs ~30 us per sequence and strategy: big batches get fewer strategies
    size = min(HYDRAULIS_POOL_SIZE, max(HYDRAULIS_MIN_POOL_SIZE, HYDRAULIS_DISPATCH_BUDGET // len(lengths)))
    pool = strategy_pool(lengths, coefs, cost, num_gpus, max_schemes, size)
    pool = with_homogeneous(pool, coefs, num_gpus)
    rng = np.random.default_rng(seed)
    shuffles = np.stack([rng.permutation(len(lengths)) for _ in range(HYDRAULIS_SHUFFLES)])
    best: HydraulisChoice | None = None
    for strategy in pool:
        # the pool's order and a strict `<` decide ties, as before: a strategy is cut short only
        # where a floor of its estimate shows it cannot come in below the best so far
        best_s = best[0] if best is not None else math.inf
        choice = _hydraulis_choice(strategy, lengths, cost, shuffles, best_s)
        if choice is not None and choice[0] < best_s:
            best = choice
    return PeerChoice(_simulated(best, cost) if best is not None else None, len(coefs), len(pool), len(pool))


HydraulisChoice = tuple[float, Strategy, tuple[SchemeCoefficients, ...], list[tuple[list[np.ndarray], list[float]]]]


def _hydraulis_choice(
    strategy: Strategy, lengths: np.ndarray, cost: ProfileCostModel, shuffles: np.ndarray, beat_s: float = math.inf
) -> HydraulisChoice | None:
    """(Hydraulis estimate incl. gradient sync, strategy, coefs, packing per pipeline) or None.

    None also where the strategy's estimate cannot come in below `beat_s` (the best so far): its
    area floor (`hydraulis_floor_s`) is above it, or every shuffle's dispatch passes it
    (`hydraulis_give_up`); what the estimate would have been is then not computed."""
    coefs = tuple(cost.coefficients(scheme) for scheme in strategy.pipeline_schemes())
    if len(lengths) < len(coefs) or lengths.max() > max(coef.capacity_tokens for coef in coefs):
        return None
    sync_s = cost.grad_sync_s(strategy.pipeline_schemes())
    margin_s = FLOOR_SLACK * beat_s
    if hydraulis_floor_s(lengths, coefs) + sync_s > beat_s + margin_s:
        return None
    assignment = hydraulis_dispatch(lengths, coefs, shuffles, beat_s - sync_s + margin_s)
    if assignment is None:
        return None
    packings = []
    estimate_s = 0.0
    for members, coef in zip(assignment, coefs, strict=True):
        micro_batches, times, pipeline_estimate_s = hydraulis_pack(members, lengths, coef)
        estimate_s = max(estimate_s, pipeline_estimate_s)
        packings.append((micro_batches, times))
    return estimate_s + sync_s, strategy, coefs, packings


def hydraulis_floor_s(lengths: np.ndarray, coefs: Sequence[SchemeCoefficients]) -> float:
    """A floor of the largest pipeline estimate `hydraulis_pack` can give any dispatch of
    `lengths` over these pipelines (the profile's a, b and c are never negative).

    A pipeline of `g` GPUs and `pp` stages whose items have work `W` and `n` tokens packs them
    into `v >= n / capacity` micro-batches of mean time `W / v + c`, so its estimate
    `(v + pp - 1) max t` is at least `W + v c + (pp - 1) c >= sum over its items of
    (w + c l / capacity) + (pp - 1) c`. The largest estimate is at least the GPU-weighted mean of
    all pipelines' estimates, and each item adds at least its least `g (w + c l / capacity)` over
    the kinds that hold it."""
    kinds, kind_of = pipeline_kinds(coefs)
    as_float = lengths.astype(np.float64)[:, None]
    gpus = np.array([coef.scheme.num_gpus for coef in kinds], dtype=np.float64)
    per_token = np.array([coef.c / coef.capacity_tokens for coef in kinds])[None, :]
    work = _item_work(as_float, kinds) + per_token * as_float
    fits = as_float <= np.array([coef.capacity_tokens for coef in kinds])[None, :]
    least = np.where(fits, work * gpus[None, :], np.inf).min(axis=1).sum()
    fill = np.array([(coef.scheme.pp - 1) * coef.c for coef in kinds])  # the bubbles' least time
    return float((least + (gpus * fill)[kind_of].sum()) / gpus[kind_of].sum())


def hydraulis_give_up(kinds: Sequence[SchemeCoefficients], beat_s: float) -> np.ndarray:
    """For each kind, the dispatch estimate (summed item work) past which a pipeline of that kind
    packs to an estimate above `beat_s` (all inf for an infinite `beat_s`).

    `v` micro-batches of mean time `W / v + c` give an estimate `(v + pp - 1) max t >= (v + pp - 1)
    (W / v + c)`, at least `W + c` without a pipeline and, with `P = pp - 1 >= 1` bubbles, at least
    its least over real `v`, `(sqrt(W) + sqrt(P c))^2`."""
    limits = np.full(len(kinds), np.inf)
    if not math.isfinite(beat_s):
        return limits
    for index, coef in enumerate(kinds):
        bubbles = coef.scheme.pp - 1
        if bubbles == 0:
            limits[index] = beat_s - coef.c
        else:
            root = math.sqrt(max(beat_s, 0.0)) - math.sqrt(bubbles * coef.c)
            limits[index] = root * root if root > 0 else -1.0
    return limits


def _item_work(as_float: np.ndarray, kinds: Sequence[SchemeCoefficients]) -> np.ndarray:
    """`a l^2 + b l` of each item (rows) on each kind (columns)."""
    a = np.array([coef.a for coef in kinds])[None, :]
    b = np.array([coef.b for coef in kinds])[None, :]
    return a * as_float * as_float + b * as_float


def _simulated(choice: HydraulisChoice, cost: ProfileCostModel) -> Candidate:
    """The chosen packing with its exact 1F1B times; micro-batches run in the order packed
    (Hydraulis does not reorder them)."""
    _, strategy, coefs, packings = choice
    packed = tuple(
        PackedPipeline(
            tuple(micro_batches),
            tuple(times),
            simulate_1f1b(times, coef.scheme.pp, coef.fwd_fraction),
        )
        for (micro_batches, times), coef in zip(packings, coefs, strict=True)
    )
    return _candidate(strategy, coefs, packed, cost)


def hydraulis_dispatch(
    lengths: np.ndarray, coefs: Sequence[SchemeCoefficients], shuffles: np.ndarray, beat_s: float = math.inf
) -> list[np.ndarray] | None:
    """Randomised first-fit dispatch, best of the given shuffles (rows of item permutations).

    A pipeline's estimate is its summed per-sequence stage work `a l^2 + b l`. In each shuffle's
    order, a sequence goes to the first pipeline (in placement order) whose capacity fits it and
    whose estimate after taking it stays within the current maximum estimate; if none does, to the
    fitting pipeline with the least estimate after taking it. The shuffle with the least maximum
    estimate wins (first on ties); shuffles that leave a pipeline empty are discarded (Hydraulis
    fails on them). The loop is `kernels.first_fit_shuffles`. None when every shuffle leaves one
    empty, or when every shuffle gives a pipeline work that packs to an estimate above `beat_s`
    (`hydraulis_give_up`: such shuffles are stopped there).
    """
    kinds, kind_of = pipeline_kinds(coefs)
    as_float = lengths.astype(np.float64)[:, None]
    capacity = np.array([coef.capacity_tokens for coef in kinds])[None, :]
    work = _item_work(as_float, kinds)  # (items, kinds of pipeline)
    give_up = hydraulis_give_up(kinds, beat_s)
    scores, choices = first_fit_shuffles(work, as_float <= capacity, kind_of, shuffles.astype(np.int64), give_up)
    best = int(np.argmin(scores))
    if not math.isfinite(scores[best]):
        return None
    order, picks = shuffles[best], choices[best]
    return [np.sort(order[picks == pipeline]).astype(np.int64) for pipeline in range(len(coefs))]


def hydraulis_pack(
    item_indices: np.ndarray, lengths: np.ndarray, coef: SchemeCoefficients
) -> tuple[list[np.ndarray], list[float], float]:
    """Micro-batches (item indices), their stage times and the estimate `(v + pp - 1) * max t`.

    `v` ranges from the least count the capacity allows to one micro-batch per item. Every `v` is
    first priced by the optimistic `(v + pp - 1) * (max(W / v, w_max) + c)` (W: total work,
    w_max: the heaviest item); the least count and the best few by that price are packed greedily
    (heaviest first into the lightest micro-batch with room, `planner.packing`'s balancing) and
    the packing with the least true estimate wins (fewest micro-batches on ties).
    """
    order = by_length_descending(item_indices, lengths)
    sub_lengths = lengths[order].astype(np.float64)
    num_items = len(sub_lengths)
    bubbles = coef.scheme.pp - 1
    least = max(1, math.ceil(float(sub_lengths.sum()) / coef.capacity_tokens))
    item_work = coef.a * sub_lengths * sub_lengths + coef.b * sub_lengths
    counts = np.arange(least, num_items + 1)
    price = (counts + bubbles) * (np.maximum(item_work.sum() / counts, item_work[0]) + coef.c)
    tried = [
        least,
        *counts[np.argsort(price, kind="stable")[: HYDRAULIS_PACKINGS_PER_PIPELINE - 1]].tolist(),
    ]
    best: tuple[float, int, list[list[int]], list[float]] | None = None
    for count in sorted(set(tried)):
        balanced = balance_lpt(sub_lengths, count, coef)
        if balanced is None:
            continue
        bins, times = balanced
        estimate_s = (len(bins) + bubbles) * max(times)
        if best is None or (estimate_s, len(bins)) < (best[0], best[1]):
            best = (estimate_s, len(bins), bins, times)
    count = least
    while best is None:
        # capacity-tight: more micro-batches until the greedy packing fits (one per item does)
        count += 1
        balanced = balance_lpt(sub_lengths, count, coef)
        if balanced is not None:
            bins, times = balanced
            best = ((len(bins) + bubbles) * max(times), len(bins), bins, times)
    estimate_s, _, bins, times = best
    return [order[members] for members in bins], list(times), estimate_s


# ---------------------------------------------------------------------------------------------
# shared
# ---------------------------------------------------------------------------------------------


def strategy_pool(
    lengths: np.ndarray,
    coefs: Sequence[SchemeCoefficients],
    cost: ProfileCostModel,
    num_gpus: int,
    max_schemes: int,
    limit: int,
) -> list[Strategy]:
    """Up to `limit` strategies over `coefs` in the order hydraplan's search meets them: scheme
    sets (at most `max_schemes`) by their fluid lower bound, best first, and within a set the
    pipeline counts nearest (in GPUs) to the fluid optimum."""
    tables = BoundTables.build(lengths, coefs)
    ranked = sorted(
        (
            bound + sync_lower_bound_s(cost, [coefs[column] for column in columns], num_gpus),
            len(columns),
            columns,
        )
        for columns, bound in tables.all_set_bounds(max_schemes, num_gpus)
    )
    pool: list[Strategy] = []
    for _, _, columns in ranked:
        schemes = [coefs[column].scheme for column in columns]
        with np.errstate(invalid="ignore", divide="ignore"):  # cost-free profiles give NaN
            ideal = tables.ideal_counts(columns, num_gpus)
        for counts in _counts_near(ideal, schemes, num_gpus)[:COUNTS_PER_SCHEME_SET]:
            pool.append(Strategy.of(list(zip(schemes, counts, strict=True))))
            if len(pool) >= limit:
                return pool
    return pool


def with_homogeneous(pool: Sequence[Strategy], coefs: Sequence[SchemeCoefficients], num_gpus: int) -> list[Strategy]:
    """`pool` after every homogeneous strategy of `coefs` (each scheme whose size divides the
    cluster, on all of it), without repeats."""
    homogeneous = [
        Strategy.of([(coef.scheme, num_gpus // coef.scheme.num_gpus)])
        for coef in coefs
        if num_gpus % coef.scheme.num_gpus == 0
    ]
    return list(dict.fromkeys([*homogeneous, *pool]))


def _counts_near(ideal: Sequence[float], schemes: Sequence, num_gpus: int) -> list[tuple[int, ...]]:
    """Count vectors (>= 1 pipeline per scheme, exactly `num_gpus` GPUs) nearest to `ideal`.

    Every scheme but the smallest takes its floor or ceiling of the ideal, or one more on either
    side; the smallest fills the rest. When no such vector exists, the first vectors of
    `count_vectors` stand in.
    """
    sizes = [scheme.num_gpus for scheme in schemes]
    ideal = [want if math.isfinite(want) else 1.0 for want in ideal]  # cost-free profiles
    filler = sizes.index(min(sizes))
    choices = [
        [0] if index == filler else sorted({max(1, math.floor(want) + step) for step in (-1, 0, 1, 2)})
        for index, want in enumerate(ideal)
    ]
    vectors = []
    for choice in itertools.product(*choices):
        remainder = num_gpus - sum(count * size for count, size in zip(choice, sizes, strict=True))
        if remainder >= sizes[filler] and remainder % sizes[filler] == 0:
            vectors.append(tuple(remainder // sizes[filler] if i == filler else c for i, c in enumerate(choice)))
    if not vectors:
        vectors = list(itertools.islice(count_vectors(schemes, num_gpus), FALLBACK_COUNT_VECTORS))

    def distance(counts: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
        return (
            sum(abs(count - want) * size for count, want, size in zip(counts, ideal, sizes, strict=True)),
            counts,
        )

    return sorted(vectors, key=distance)


def _best_homogeneous(
    name: str,
    request: PlanRequest,
    profile: CostProfile,
    build: Callable[[np.ndarray, SchemeCoefficients, int, ProfileCostModel], Candidate | None],
    interleaved: bool = False,
) -> Plan:
    """One scheme on every replica, the best of all schemes that divide N by simulated step time;
    `interleaved`: each with its recipe's chunk count (`_interleaved_dividing`)."""
    cost = ProfileCostModel(profile)
    homogeneous = _dividing(cost, request.num_gpus)
    if not homogeneous:
        raise PlanningError(f"{name}: no scheme of the profile divides {request.num_gpus} GPUs evenly")
    if interleaved:
        homogeneous, missing = _interleaved_dividing(cost, request.num_gpus)
        if missing and all(coef.scheme.v == 1 for coef in homogeneous):
            counts = sorted({scheme.v for scheme in missing})
            shown = ", ".join(str(scheme) for scheme in missing[:6]) + (", ..." if len(missing) > 6 else "")
            raise PlanningError(
                f"{name}: the profile prices none of the interleaved schemes the recipe runs "
                f"({shown}); build it with virtual stages "
                f"{', '.join(map(str, counts))} (hydraplan plan --virtual-stages, or "
                "build_profile(virtual_stages=...))"
            )
    items = _items_for(name, request, homogeneous)
    choice = _best_homogeneous_choice(items.lengths, cost, homogeneous, request.num_gpus, build)
    if choice.candidate is None:
        raise PlanningError(f"{name}: no homogeneous strategy can hold the batch (too few sequences or capacity)")
    return _plan(name, request, profile, cost, items, choice)


def _dividing(cost: ProfileCostModel, num_gpus: int) -> list[SchemeCoefficients]:
    return [cost.coefficients(scheme) for scheme in cost.schemes() if num_gpus % scheme.num_gpus == 0]


def _best_homogeneous_choice(
    lengths: np.ndarray,
    cost: ProfileCostModel,
    homogeneous: list[SchemeCoefficients],
    num_gpus: int,
    build: Callable[[np.ndarray, SchemeCoefficients, int, ProfileCostModel], Candidate | None],
) -> PeerChoice:
    """The best of `build`'s plans of the items on each scheme of `homogeneous` (`_dividing`):
    the least (step time, strategy name).

    The schemes are built in the order of a floor of their step time (`_homogeneous_floor_s`), and
    none whose floor is above the fastest built so far: its plan cannot be faster (wlb at 8B /
    4,096 H100: 101 packings of 63K sequences, 1.7 s; the same choice)."""
    as_float = lengths.astype(np.float64)
    totals = (float(as_float @ as_float), float(as_float.sum()))
    floors = sorted(
        (_homogeneous_floor_s(coef, num_gpus, totals, cost), index) for index, coef in enumerate(homogeneous)
    )
    best: Candidate | None = None
    feasible = 0
    for floor_s, index in floors:
        if best is not None and floor_s * (1 - FLOOR_SLACK) > best.step_time_s:
            break  # this floor and every later one is above the fastest: none can beat it
        candidate = build(lengths, homogeneous[index], num_gpus, cost)
        if candidate is None:
            continue
        feasible += 1
        if best is None or (candidate.step_time_s, str(candidate.strategy)) < (best.step_time_s, str(best.strategy)):
            best = candidate
    return PeerChoice(best, len(homogeneous), len(homogeneous), feasible)


def _homogeneous_floor_s(
    coef: SchemeCoefficients, num_gpus: int, totals: tuple[float, float], cost: ProfileCostModel
) -> float:
    """No plan of the items on `num_gpus / scheme size` replicas of `coef` (that divide N) is
    faster: some replica's stage 0 runs at least its share of all the items' work `W` and of the
    overhead c of the at least `ceil(tokens / capacity)` micro-batches they fill, then the
    gradient sync (`_stage_floor_s` of all the items, spread evenly)."""
    num_replicas = num_gpus // coef.scheme.num_gpus
    if num_replicas == 0:
        return 0.0
    return _stage_floor_s(coef, *totals) / num_replicas + cost.grad_sync_s([coef.scheme] * num_replicas)


def peer_choice(name: str, lengths: np.ndarray, cost: ProfileCostModel, num_gpus: int, max_schemes: int, seed: int):
    """What baseline `name` chooses for exactly these items (no sequence cut differently): its
    candidate (None when it cannot hold them) and its search statistics. The schemes are chosen
    as the baseline's own plan chooses them, from the items."""
    if name in ("megatron", "wlb"):
        build = _megatron_candidate if name == "megatron" else _wlb_candidate
        return _best_homogeneous_choice(lengths, cost, _dividing(cost, num_gpus), num_gpus, build)
    if name in INTERLEAVED_BASELINES:
        build = _megatron_candidate if INTERLEAVED_BASELINES[name] == "megatron" else _wlb_candidate
        homogeneous, _ = _interleaved_dividing(cost, num_gpus)
        if all(coef.scheme.v == 1 for coef in homogeneous):  # nothing interleaved: the plain baseline's plan
            return PeerChoice(None, len(homogeneous), 0, 0)
        return _best_homogeneous_choice(lengths, cost, homogeneous, num_gpus, build)
    if name == "flexsp":
        coefs = flexsp_schemes(cost, num_gpus, int(lengths.max()))
        return flexsp_choice(lengths, cost, coefs, num_gpus, max_schemes)
    if name == "hydraulis":
        return hydraulis_choice(lengths, cost, _hydraulis_schemes(cost, num_gpus), num_gpus, max_schemes, seed)
    raise PlanningError(f"unknown baseline {name!r}; valid: {', '.join(sorted(BASELINES))}")


def _homogeneous_candidate(
    coef: SchemeCoefficients,
    num_replicas: int,
    packed: Sequence[PackedPipeline],
    cost: ProfileCostModel,
) -> Candidate:
    strategy = Strategy.of([(coef.scheme, num_replicas)])
    return _candidate(strategy, tuple(coef for _ in range(num_replicas)), tuple(packed), cost)


def _candidate(
    strategy: Strategy,
    coefs: Sequence[SchemeCoefficients],
    packed: Sequence[PackedPipeline],
    cost: ProfileCostModel,
) -> Candidate:
    return Candidate(
        strategy=strategy,
        coefs=tuple(coefs),
        assignment=tuple(np.concatenate(p.micro_batches) for p in packed),
        packed=tuple(packed),
        grad_sync_s=cost.grad_sync_s(strategy.pipeline_schemes()),
    )


def _items_for(name: str, request: PlanRequest, coefs: Sequence[SchemeCoefficients]) -> Items:
    """The request's items, oversize sequences handled against the baseline's largest capacity."""
    largest = max(coef.capacity_tokens for coef in coefs)
    try:
        return prepare_items(request.lengths, largest, request.options.oversize)
    except PlanningError as error:
        raise PlanningError(f"{name} (schemes {_names(coefs)}): {error}") from None


def _names(coefs: Sequence[SchemeCoefficients], shown: int = 6) -> str:
    names = ", ".join(str(coef.scheme) for coef in coefs[:shown])
    return names if len(coefs) <= shown else f"{names}, ... ({len(coefs)} in all)"


def _plan(
    name: str,
    request: PlanRequest,
    profile: CostProfile,
    cost: ProfileCostModel,
    items: Items,
    choice: PeerChoice,
) -> Plan:
    """The plan of the baseline's chosen candidate, with the switch cost from the request's
    previous strategy and a lower bound valid for the chosen strategy's schemes."""
    assert choice.candidate is not None
    previous = None
    if request.previous_strategy:
        try:
            previous = parse_strategy(request.previous_strategy)
        except ValueError as error:
            raise PlanningError(f"previous_strategy: {error}") from None
    best = dataclasses.replace(
        choice.candidate, switch_cost_s=switch_cost_s(previous, pipeline_blocks(choice.candidate.strategy), cost)
    )
    distinct = list(dict.fromkeys(best.coefs))
    tables = BoundTables.build(items.lengths, distinct)
    bound = tables.pipeline_time_bound_s(range(len(distinct)), request.num_gpus) + best.grad_sync_s + best.switch_cost_s
    stats = SolverStats(
        backend=f"baseline:{name}",
        num_schemes=choice.num_schemes,
        num_strategies=choice.num_strategies,
        num_strategies_solved=choice.num_solved,
        seed=request.options.seed,
    )
    return build_plan(request, profile, items, best, bound, stats, False)


BASELINES: dict[str, Callable[[PlanRequest, CostProfile], Plan]] = {
    "megatron": megatron,
    "wlb": wlb,
    "flexsp": flexsp,
    "hydraulis": hydraulis,
    "megatron-vpp": megatron_vpp,
    "wlb-vpp": wlb_vpp,
}


def run_baseline(name: str, request: PlanRequest, profile: CostProfile) -> Plan:
    """Plan the batch the way baseline `name` would; the plan has passed `planner.check`."""
    try:
        baseline = BASELINES[name]
    except KeyError:
        raise PlanningError(f"unknown baseline {name!r}; valid: {', '.join(sorted(BASELINES))}") from None
    require_switch_pricing(request.previous_strategy, profile)
    placeable = placeable_profile(profile, request.num_gpus, request.gpus_per_node)
    plan = baseline(request, placeable)
    if placeable is not profile:  # the plan answers the request with the profile it came with
        plan = identified(plan.model_copy(update={"request_hash": request_hash(request, profile)}))
    violations = check_plan(plan)
    if violations:
        raise AssertionError(f"baseline {name} produced an invalid plan: " + "; ".join(violations[:5]))
    return plan
