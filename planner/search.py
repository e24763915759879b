"""Strategy search: branch and bound with an anytime incumbent and a valid lower bound.

The frontier holds scheme *sets* (bounded by the area bound, valid for every pipeline count) and
*strategies* (bounded by the count-aware dual bound plus their gradient sync; the switch cost,
never negative, is left out of bounds and charged when a strategy is solved; see
`planner.bounds`). The search

1. solves the previous strategy (if any) and the most promising homogeneous strategies, whose set
   bounds are high but which are often near the best;
2. alternates: expand scheme sets in bound order while their bound beats the incumbent and the
   best queued estimate, then solve the queued strategy with the best *estimate* (the fluid
   division of the items by length intervals with 1F1B bubbles priced in, `planner.fluid`),
   skipping strategies whose bound cannot beat the incumbent; before its first such solve, every
   PROBE_EVERY expansions, the best-estimated strategy so far is solved ahead and kept aside
   (a probe: used when the search reaches it, so the uncut search is the same), and on a slow
   machine the best candidate so far is polished ahead the same way (EARLY_POLISHES);
3. stops at the work limits (deterministic) or at its share of the time limit.

The time limit is hard at every scale: once the first strategy is solved (the first incumbent,
always), every phase asks the clock before each unit of work and stops with the incumbent. When
time is short the set bounds come before more screening (without them the global bound falls
back to a floor over all schemes), screening and expansions stop at the search's share of the
time, polishes start only if the time left covers what the last one took, and a MILP too large to
build in the time left is not built. Stopping at the clock is status `timeout_incumbent`; the
same request under the work limits alone gives the same plan.

**The chunk count v** (interleaved 1F1B) is chosen by the enumeration: every interleaved entry
`<tp,pp,cp,v>` of the profile (v dividing the layers per stage) is a scheme of its own, beside its
plain `<tp,pp,cp>`, so a strategy may run some pipelines of a `<tp,pp,cp>` plainly and others
interleaved. The alternative, v as a per-pipeline choice of the packer under one `<tp,pp,cp>`,
would keep the space and the certificate's coverage but needs every bound of a `<tp,pp,cp>` to
hold for its best v (the least of the floors, the most capacity): it loosens the plain schemes'
bounds wherever an interleaved entry exists. Enumerated, the plain entries keep their 1F1B
floors, the interleaved ones have their own (`planner.bubble_floor`, item 3), dominance prunes
within one schedule only (`runnable_schemes`), and the certificate lists the interleaved schemes
like the others. v is offered where the profile prices it: an interleaved entry (per-chunk
coefficients and its own capacity, e.g. `hydraplan profile --virtual-stages` or the analytic
model's `virtual_stages`); a profile without one plans plain 1F1B, as before, byte for byte.
Measured in `benchmarks/results/vsearch.md`.

Scheme sets are seeded once the first incumbents are known: their bounds price the 1F1B bubble
for pipelines that could still beat the incumbent (`planner.bounds`), and sets that cannot are
not even listed. An expanded set's bound stays a floor under its strategies' bounds.

Nothing is discarded unless its bound is no better than the incumbent, so the least bound of the
unexpanded sets and of every enumerated strategy stays a lower bound over the whole space.

Backends then polish the best strategies found: `lp` re-dispatches by LP relaxation + rounding,
`cpsat`/`pulp` by MILP with the incumbent as hint, `auto` runs LP then (for small models) CP-SAT;
all but `greedy` refine each polished candidate a little and the best one fully (`planner.refine`),
then (with a thorough budget) search the packing of its slowest pipelines locally.
Last, what holds the global bound down is tightened, least first, up to work limits: unexpanded
sets with a bound that couples their area to their weight replicas and a packing bound, enumerated
strategies with the packing bound (items that cannot be split between pipelines;
`BoundTables.packing_bounds`) or, for batches of at most `planner.few_items.MAX_ITEMS` items, the
assignment bound, whose best assignments also become plans.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.planner.bounds import DFF_NAMES, BoundTables, SyncFloors
from hydraplan.planner.candidate import Candidate
from hydraplan.planner.certificate import build_certificate
from hydraplan.planner.cost import ProfileCostModel, SchemeCoefficients
from hydraplan.planner.counts import capped_count_vectors, fillable, near_ideal
from hydraplan.planner.dispatch import greedy_dispatch, least_items
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.few_items import MAX_ITEMS as FEW_ITEMS
from hydraplan.planner.few_items import few_items_bound
from hydraplan.planner.fluid import interval_fluid_s
from hydraplan.planner.lp_dispatch import lp_dispatch
from hydraplan.planner.milp import solve_milp
from hydraplan.planner.packing import PackedPipeline, best_order, pack_pipeline
from hydraplan.planner.refine import polish_packings, refine
from hydraplan.planner.schemas import BoundCertificate, CostProfile, SolverBackend
from hydraplan.planner.speculation import SpeculativeSolver
from hydraplan.planner.strategies import Strategy, placement_key, unplaceable_reason
from hydraplan.planner.switching import pipeline_blocks, switch_cost_s

MAX_STRATEGIES_PER_SET = 4000
# set bounds over more distinct lengths than this use coarsened tables (rows of lengths within 2%):
# ~0.6 s of the 2 s budget went to seeding 4,390 sets over 2,500 lengths at 70B / 256 GPUs
EXACT_SET_BOUND_MAX_LENGTHS = 1024
SEEDED_BLOCKS_PER_PUSH = 128  # blocks of scheme sets bounded between two pushes into the frontier
# strategies polished at the default budget, scaled with the work limits (a longer budget polishes
# more): at 10 s, 8B / 64 H100 LongAlign seed 2 solved more strategies than at 2 s, and the one
# that polished best (8x<2,1,4>, 2.868 s) was no longer among the 4 best screened, so the longer
# budget planned 2.939 s until the count grew with it
NUM_POLISHED = 4
NUM_POLISHED_BRIEF = 2  # under budgets below THOROUGH_MIN_BUDGET_S (e.g. a service's 0.1 s)
NUM_RUNNERS_UP = 8
NUM_HOMOGENEOUS_FIRST = 4  # homogeneous strategies solved before the search proper
QUEUE_HEAD = 8  # queued strategies a speculative solver may start ahead of the search
# auto's MILP polish only where the model builds fast (~30 us per variable, outside the MILP's own
# time limit): larger batches rely on LP + refinement
AUTO_MILP_MAX_VARIABLES = 4_000
# ... and only where its budget covers CP-SAT's fixed cost (~50 ms measured for a 512-variable
# model); below it the polish overran its share of a 0.1 s budget fivefold for a 0.2% gain
AUTO_MILP_MIN_BUDGET_S = 0.05
# Building a MILP (Python objects per variable, and for PuLP the file CBC reads) measured per
# dispatch variable on the 2-core EPYC: CP-SAT 20-33 us, PuLP 70-90 us; models this small are
# always built (the exact models of tiny batches, a few ms)
MILP_BUILD_S_PER_VARIABLE = {"cpsat": 35e-6, "pulp": 100e-6}
MILP_ALWAYS_BUILT_VARIABLES = 2_000
# the wall-time cap of a MILP solve, over its work limit (CP-SAT's deterministic time, roughly
# seconds on a quiet machine): a loaded machine may take longer for the same work
MILP_WALL_SLACK = 3.0
MAX_REFINED_SETS = 1200  # unexpanded sets re-bounded with the replica-coupled bound after the search
REFINED_SETS_PER_BATCH = 200
MAX_PACKING_BOUNDED = 600  # enumerated strategies re-bounded with the packing bound after the search
PACKING_BOUNDED_PER_BATCH = 30
# sets expanded after the search to bound their strategies, each a step of MAX_BOUND_STEPS: for a
# few items always, else while the strategies enumerated stay under `max_enumerated_rows` (8B / 64
# H100 LongAlign, ~44 items of 8K-32K tokens: a set held its bound at 10 s, 2.6473 s, until
# expanded; its strategies' packing bounds then raised it to 2.6556 s)
MAX_BOUND_EXPANSIONS = 100
# At scale, where a scheme runs many pipelines (MANY_PIPELINES or more), the search's solves go to
# strategies near the fluid optimum, and the long sequences' granularity wants more of the schemes
# that hold them: at 8B / 1,024 H100 (Wikipedia seed 0) the best strategy solved was `91x<2,1,2> +
# 71x<1,1,2> + 518x<1,1,1>` and the plan flexsp's (1.908 s). After the search proper, the best
# solved strategy with such a scheme moves GPUs between its schemes (`_count_moves`), reaching
# `103x<2,1,2> + 54x<1,1,2> + 504x<1,1,1>`-like strategies (1.85 s). Moves of COUNT_MOVE_STEPS lcm
# groups of GPUs, largest first; at most `WorkLimits.count_moves` solves: 6 per 2 s of budget, 30
# at the 10 s that 1,024 GPUs get by default (a screened solve there takes ~0.045 s). Measured on
# the six seeds' screens with every descent replayed on the same solves (speed-up over flexsp,
# geometric mean): steps (16, 8, 4, 2, 1) gave 1.0287x at 10, 15 and 1.0291x at 20 solves; (8, 4,
# 2, 1) 1.0289x, 1.0297x, 1.0298x, 1.0300x, 1.0303x at 10, 15, 20, 25, 30 solves and 1.0303x at 40
# and 60 (the descents end by then), no seed worse for more; (4, 2, 1) 1.0297x at 30-60; (16, 4, 1)
# and (24, 8, 2) less; trying the last improving direction first changed nothing. An exhaustive
# grid of every second count around the optimum (625 solves) found 1.0232x on seed 4 and 1.0319x
# on seed 0 (30 solves: 1.0232x and 1.0315x), so the scheme set itself caps the six seeds near
# 1.030x. From the best such strategy alone: moving from the best two scheme sets, sharing the
# solves, left the descent short.
# Skipping queued strategies within 4% of a solved one (to spread the solves) changed no plan
MANY_PIPELINES = 50
COUNT_MOVE_STEPS = (8, 4, 2, 1)
MAX_COUNT_MOVES = 6
# steps (bisection steps of a packing bound, node blocks of the assignment bound) the bounds are
# tightened with after the search: 190-330 were taken at 8-32 GPUs when only the clock ended them
MAX_BOUND_STEPS = 400
# ... times this factor more from twice the default budget on (4 s and more), beyond the budget's
# scale: at 10 s the search proper and the polish of 32B / 64 A100 took 2-4 s of CPU and the
# tightening ended by its 2,000 steps with the sets and strategies of deep pipelines below 3% of
# the plan still waiting (lognormal seed 0: 993 strategies, 1,671 sets). With 3x, 32B gap p50 at
# 10 s fell from 4.27% to 3.59% on the same plans, CPU p50 5.7 s, at most 6.4 s; 6x raised no
# further bound on lognormal seed 0 (strategies of deep pipelines then hold it, at the bound
# their own packing bound reaches alone) for 3.4 s more
DEEPER_BOUND_STEPS_FACTOR = 3
REFINE_ROUNDS = 20  # for the best candidate
REFINE_ROUNDS_EACH = 4  # for every polished candidate
PACKING_SEARCH_EVALUATIONS = 1500  # exact simulations per pipeline in the packing local search
BOUND_RESERVE_SHARE = 0.15  # of the time limit, kept from the packing local search for the bounds
# Work limits keep the search deterministic; the time shares are only a safety net.
MIN_EXPANSIONS = 24  # scheme sets expanded whatever the clock says
# strategies enumerated between two solves at most: at 1,024 GPUs sets hold ~1,200 strategies each,
# and the expansions took the whole 10 s budget (61K strategies) before any mixed one was solved;
# never reached at 64 GPUs (4,316 strategies in the 8B default's 100 expansions)
STRATEGIES_PER_SOLVE = 8000
# strategies the search proper solves (after the homogeneous ones) even in the polish's share of
# the time, as long as the slowest solve so far still fits before the deadline: under load the
# expansions used to end at the polish's share with none solved, and the plan was a polished
# homogeneous one (70B / 256 at load 6: 21.47 s; solving the best-estimated two gave 19.16 s)
MIN_SEARCH_SOLVES = 2
# Probes: before the search proper's first solve, every PROBE_EVERY expansions, the best-estimated
# strategy enumerated so far is solved ahead and kept aside. It neither joins the solved candidates
# nor moves the incumbent, so what the search expands and solves is unchanged: when the search
# reaches that strategy in its own order it takes the kept candidate instead of solving it again,
# and a probe the search never reaches is dropped, so an uncut search gives the same plan, byte
# for byte. Only when the clock cuts the search do the kept candidates join the solved ones. At
# 70B / 256 H100 (seed 0) the winning strategy's set is the 18th of 100 expanded and its strategy
# the best estimate from then on, yet it was first solved after all 100 expansions: under load the
# clock cut the expansions before it was. Probes stop at `WorkLimits.max_expansions` (4 at the default
# budget): a probe the search never reaches is one solve wasted. 0 turns probes off.
PROBE_EVERY = 24
# After a probe, once the search has used EARLY_POLISH_AFTER_SHARE of its time to its deadline (a
# slow machine: on a quiet 2-core EPYC the first probe of 70B / 256 comes at ~15% of it), the best
# candidate solved so far (incumbents and probes) is polished ahead (`polish_candidate`) unless it
# already was, up to EARLY_POLISHES times, kept aside the same way: the polish at the end takes it,
# whatever the clock says, when that candidate is among those it polishes, and drops it (one polish
# wasted, ~0.1 s of CPU at 70B / 256) when not. Polishing ahead changes no plan (the same polish of
# the same candidate, done sooner), so the clock may decide it; always on, it cost 0.1-0.2 s of CPU
# on 3 of 4 70B / 256 seeds. The final plan of 70B / 256 H100 is the LP polish of the best screened
# strategy; with CPU-bound neighbours the clock left no time for that polish at the end (19.16 s,
# not 18.80 s), though the strategy itself was solved by its probe. The MILP backends' polish is a
# MILP solve capped by the clock: not done ahead.
EARLY_POLISHES = 2  # 0: none
EARLY_POLISH_AFTER_SHARE = 0.25
EARLY_POLISHED_BACKENDS = (SolverBackend.LP, SolverBackend.AUTO)
# 100: under the validated analytic model (issue 13) the default request's set bounds sit closer
# together, and 200 expansions took ~0.9-1.2 s of the 2 s default on a quiet 2-core EPYC, so that a
# CPU-bound neighbour made the clock cut every run; 100 gives the same plan and the same bound there
MAX_EXPANSIONS = 100
# of the time limit, for expanding scheme sets: as far as screening goes for `auto`, so that at
# the default budget a CPU-bound neighbour does not push the expansions into this safety net (at
# 0.6 the clock cut them there, and the plan was no longer reproducible)
EXPANSION_SHARE = 0.7
# the budget the work limits above are sized for (the default): other budgets scale them ...
WORK_REFERENCE_BUDGET_S = 2.0
# ... up to this factor (a 10 s budget). Measured at 10 s, the clock standing still, seed 0: 32B /
# 64 A100 planned 5.412 s instead of 5.544 s with a bound of 5.163 s instead of 5.084 s (gap 4.6%,
# was 8.3%) in 1.6 s of CPU
MAX_WORK_SCALE = 5.0
# up to this many expansions beyond MAX_EXPANSIONS, each only while the strategies enumerated times
# the distinct lengths (what bounding and estimating them costs) stay below ENUMERATED_ROWS_PER_SCALE
# (both times the work scale). At the default budget, seed 0, the clock standing still: 32B / 64
# A100 (~190 lengths, 148 strategies after 100 expansions) then expands up to ~500 sets (Wikipedia
# 5.590 -> 5.412 s, SFT mix 5.526 -> 5.085 s, +0.3 s of CPU); 70B / 256 H100 (~2,500 lengths) and
# 8B / 64 H100 Wikipedia (4,316 strategies over ~900 lengths) and 1,024 H100 expand none more
MAX_EXTRA_EXPANSIONS = 400
ENUMERATED_ROWS_PER_SCALE = 200_000
# The estimate's bubble for a pipeline holding its scheme's longest fitting item (`_bubble_inflation`):
# that item's micro-batch costs between (1-2f)(pp-1) and (pp-1) of its stage time
# (`planner.bubble_floor`'s largest-micro-batch path; sorted order), and the deepest schemes hold the
# batch's longest item only where it has no better home. Charging all (pp-1) put deep pipelines last:
# at 70B / 256 H100 the strategy that won after polishing was 6th in solve order (seed 0); with half,
# 2 solves past the first incumbents reach the uncut plan on seeds 0 and 1 (4 were not enough on
# seed 0). Over 18 batches of 70B, 32B and 8B at 2 solves: 2 better, 1 worse (0.6%), the same
# uncut plans (`benchmarks/results/search_estimates.md`).
LONG_ITEM_BUBBLE_SHARE = 0.5
# ... and fewer strategies than this (times the work scale): each costs ~0.2 ms to bound and estimate
# over any number of lengths (8B / 64 H100 LongAlign batches, 44 lengths, enumerated 7,445 strategies
# in 0.5 s of CPU more without it)
ENUMERATED_PER_SCALE = 1_000
# an LP polish re-dispatches and re-packs the whole batch: 1.3-1.9x one greedy screen, measured
# at 1,024 and 4,096 GPUs; the first polish starts only if the time left covers this many screens
POLISH_PER_SCREEN = 2.0
SEEDING_SHARE = 0.2  # of the time limit, kept for the set bounds when screening the first strategies
SEARCH_TIME_SHARE = {SolverBackend.GREEDY: 0.95, SolverBackend.LP: 0.8, SolverBackend.AUTO: 0.7}


@dataclass(frozen=True)
class WorkLimits:
    """How much the search may do beyond `max_strategies_solved`: what ends it when the clock
    does not (so what makes it deterministic). The defaults fit the default 2 s budget."""

    max_expansions: int = MAX_EXPANSIONS
    # expansions beyond `max_expansions`, each only while the strategies enumerated times the
    # distinct lengths stay below `max_enumerated_rows`
    max_extra_expansions: int = MAX_EXTRA_EXPANSIONS
    max_enumerated_rows: int = ENUMERATED_ROWS_PER_SCALE
    max_enumerated: int = ENUMERATED_PER_SCALE
    polished: int = NUM_POLISHED  # the best strategies solved, polished (thorough settings)
    refine_rounds: int = REFINE_ROUNDS
    refine_rounds_each: int = REFINE_ROUNDS_EACH
    packing_evaluations: int = PACKING_SEARCH_EVALUATIONS
    max_refined_sets: int = MAX_REFINED_SETS
    max_packing_bounded: int = MAX_PACKING_BOUNDED
    max_bound_expansions: int = MAX_BOUND_EXPANSIONS
    count_moves: int = MAX_COUNT_MOVES
    bound_steps: int = MAX_BOUND_STEPS

    @classmethod
    def for_budget(cls, time_limit_s: float) -> WorkLimits:
        """The default limits scaled in proportion to the budget over `WORK_REFERENCE_BUDGET_S`
        (never below one unit of each, at most MAX_WORK_SCALE times the defaults): a short budget
        then ends the search by its work limits too, where the machine's pace allows, instead of
        by the clock, and a long one searches further. From twice the reference on, the bounds'
        steps are DEEPER_BOUND_STEPS_FACTOR times more again."""
        scale = min(MAX_WORK_SCALE, time_limit_s / WORK_REFERENCE_BUDGET_S)
        if scale == 1.0:
            return cls()
        limits = {f.name: max(1, int(getattr(cls, f.name) * scale)) for f in dataclasses.fields(cls)}
        if scale >= 2:
            limits["bound_steps"] *= DEEPER_BOUND_STEPS_FACTOR
        return cls(**limits)


@dataclass(frozen=True)
class SearchSettings:
    backend: SolverBackend
    max_schemes: int
    max_strategies_solved: int
    seed: int
    pool: tuple[Strategy, ...] | None = None
    previous: Strategy | None = None
    milp_budget_s: float = 0.3  # most time one MILP solve may take
    # polish NUM_POLISHED strategies, each refined a little (else the best two), search the packing of
    # the best plan's slowest pipelines and tighten strategy bounds after the search (else sets only)
    thorough: bool = True
    work: WorkLimits = WorkLimits()


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    runners_up: tuple[Strategy, ...]  # best other strategies solved, best first
    lower_bound_s: float
    num_schemes: int
    num_strategies: int
    num_strategies_solved: int
    timed_out: bool
    certificate: BoundCertificate | None = None


@dataclass
class Clock:
    """Time left, and whether to stop (time up or cancelled); supplied by the caller.

    The search asks it only where stopping changes what is searched, so the first `stop()` that
    says yes (or a `note_cut`, for a decision taken on the time left) marks the search as cut by
    the clock: `cut` then tells that the same request may give another plan on another run.
    Without a cut, the work limits alone decided what was searched (deterministic)."""

    remaining_s: Callable[[], float]
    cancelled: Callable[[], bool]
    cut: bool = False

    def stop(self, reserve_s: float = 0.0) -> bool:
        if self.remaining_s() <= reserve_s or self.cancelled():
            self.cut = True
            return True
        return False

    def note_cut(self) -> None:
        """The time left, not a work limit, just chose what the search does next."""
        self.cut = True


def solve_strategy(
    strategy: Strategy,
    lengths: np.ndarray,
    cost: ProfileCostModel,
    previous: Strategy | None = None,
    coefs: Sequence[SchemeCoefficients] | None = None,
) -> Candidate | None:
    """Greedy dispatch then packing for one fixed strategy, its pipelines priced by `coefs` (one
    per pipeline; by default the profile's: `planner.slowdowns` passes slowed ones); None if some
    pipeline cannot get the items it needs (`least_items`)."""
    if coefs is None:
        coefs = tuple(cost.coefficients(scheme) for scheme in strategy.pipeline_schemes())
    if len(lengths) < sum(least_items(coef) for coef in coefs):
        return None
    if lengths.max() > max(coef.capacity_tokens for coef in coefs):
        return None
    assignment = greedy_dispatch(lengths, coefs)
    if assignment is None:
        return None
    return packed_candidate(strategy, coefs, assignment, lengths, cost, previous)


def packed_candidate(strategy, coefs, assignment, lengths, cost, previous, packed=None) -> Candidate:
    """The candidate of this dispatch (`assignment`, one item array per pipeline with coefficients
    `coefs`), each pipeline packed (`pack_pipeline`) unless `packed` is given, with its gradient
    sync and its switch cost from `previous`."""
    if packed is None:
        packed = tuple(pack_pipeline(items, lengths, coef) for items, coef in zip(assignment, coefs))
    return Candidate(
        strategy=strategy,
        coefs=tuple(coefs),
        assignment=tuple(np.asarray(items, dtype=np.int64) for items in assignment),
        packed=tuple(packed),
        grad_sync_s=strategy_sync_s(cost, strategy),
        switch_cost_s=switch_cost_s(previous, pipeline_blocks(strategy), cost) if previous else 0.0,
    )


def strategy_sync_s(cost: ProfileCostModel, strategy: Strategy) -> float:
    """`cost.grad_sync_s(strategy.pipeline_schemes())` from the counts alone: one weight replica
    per CP rank of every pipeline, over the strategy's schemes (no list of thousands of pipelines)."""
    replicas = sum(scheme.cp * count for scheme, count in strategy.counts)
    return cost.grad_sync_for_replicas_s(replicas, strategy.schemes)


def runnable_schemes(cost: ProfileCostModel, num_gpus: int, keep: Sequence = ()) -> list[SchemeCoefficients]:
    """Schemes that fit the cluster, without those another scheme dominates (except `keep`):
    one that uses the same GPUs and is no worse in every cost, capacity, bubble and sync term,
    and better in one of them or first in scheme order. All pairs at once (~150 schemes at 64
    GPUs: 20 ms as a Python double loop).

    Every scheme the profile prices is a candidate, its interleaved entries `<tp,pp,cp,v>` too
    (the profile validates that v divides the layers per stage; see the module docstring: v is
    chosen by enumerating those entries as schemes of their own). A scheme dominates only one of
    the same schedule: both plain 1F1B, or both interleaved with the same pp and v (the same
    order of operations, so smaller stage times and more capacity cannot make a plan slower)."""
    fitting = [cost.coefficients(scheme) for scheme in cost.all_schemes() if scheme.num_gpus <= num_gpus]
    if not fitting:
        return []
    terms = np.array(
        [
            (
                c.a,
                c.b,
                c.c,
                c.scheme.pp,
                c.scheme.cp,
                c.grad_bytes_per_gpu,
                c.sync_bytes,
                -c.capacity_tokens,
                c.fwd_fraction,
            )
            for c in fitting
        ],
        dtype=np.float64,
    )
    gpus = np.array([coef.scheme.num_gpus for coef in fitting])
    order = {coef.scheme: index for index, coef in enumerate(sorted(fitting, key=lambda c: c.scheme))}
    rank = np.array([order[coef.scheme] for coef in fitting])
    # [better, worse]: the better one no worse in every term, and strictly better somewhere
    no_worse = (terms[:, None, :] <= terms[None, :, :]).all(axis=2)
    strictly = (terms[:, None, :] < terms[None, :, :]).any(axis=2) | (rank[:, None] < rank[None, :])
    chunks = np.array([coef.scheme.v for coef in fitting])
    stages = np.array([coef.scheme.pp for coef in fitting])
    plain = chunks[:, None] == 1
    same_schedule = (chunks[:, None] == chunks[None, :]) & (plain | (stages[:, None] == stages[None, :]))
    dominates = no_worse & strictly & (gpus[:, None] == gpus[None, :]) & same_schedule
    np.fill_diagonal(dominates, False)
    dominated = dominates.any(axis=0)
    return [coef for coef, beaten in zip(fitting, dominated.tolist()) if coef.scheme in keep or not beaten]


def placeable_profile(profile: CostProfile, num_gpus: int, gpus_per_node: int) -> CostProfile:
    """The profile without the schemes `strategies.place_pipelines` cannot keep inside nodes on
    this cluster (`strategies.unplaceable_reason`; it removes none of the catalog's power-of-two
    schemes on nodes of 8); raises `PlanningError` when none is left."""
    kept = [entry for entry in profile.schemes if unplaceable_reason(entry.scheme, num_gpus, gpus_per_node) is None]
    if len(kept) == len(profile.schemes):
        return profile
    if not kept:
        raise PlanningError(
            f"no scheme of the cost profile keeps its TP groups and grids inside {gpus_per_node}-GPU nodes "
            f"on {num_gpus} GPUs"
        )
    return profile.model_copy(update={"schemes": kept})


@dataclass(frozen=True)
class Bounded:
    """A strategy with its lower bound (for the global bound) and estimate (for solve order)."""

    estimate_s: float
    fluid_estimate_s: float  # without the longest-item floor: breaks ties among floored estimates
    bound_s: float
    strategy: Strategy
    # the multipliers (one per scheme, in `strategy.counts` order) of the packing bound or of the
    # refined duals, where one raised `bound_s`: the bound certificate carries them
    # (`planner.certificate`) ...
    witness: tuple[float, ...] | None = None
    # ... and, where the packing bound priced each scheme's items by its own dual feasible function,
    # their names (`bounds.DFF_NAMES`, in the same order)
    functions: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Expansion:
    """A scheme set's strategies, bounded (`Frontier.expansion`); `huge`: too many to list, the
    set's bound stands for those left out."""

    entries: list[Bounded]
    huge: bool


class Frontier:
    """Scheme sets waiting to be expanded (by area bound) and enumerated strategies with their
    bounds and estimates."""

    def __init__(self, tables: BoundTables, cost: ProfileCostModel, num_gpus: int) -> None:
        self.tables, self.cost, self.num_gpus = tables, cost, num_gpus
        self.column_of = {coef.scheme: column for column, coef in enumerate(tables.coefs)}
        self.sets: list[tuple[float, int, tuple[int, ...]]] = []
        self.strategies: list[Bounded] = []
        self.floor_s = math.inf  # bounds of strategies that were not enumerated (huge sets)
        self.incumbent_s = math.inf  # bounds at or above it need not be tightened further
        # the tables and sync floors the set bounds were priced with, and the step time they are
        # valid under (set by `_seed_sets`)
        self.set_pricing: tuple[BoundTables, SyncFloors, float] | None = None
        self._order = itertools.count()
        self._seen: set[Strategy] = set()
        # (columns, huge, least bound of the strategies it added) of each expansion
        self.expanded: list[tuple[tuple[int, ...], bool, float]] = []

    def push_set(self, columns: tuple[int, ...], bound_s: float) -> None:
        heapq.heappush(self.sets, (bound_s, next(self._order), columns))

    def push_sets(self, sets: Sequence[tuple[int, ...]], bounds_s: Sequence[float], ordered: bool = True) -> None:
        """`push_set` of each in turn, in one heapify (the keys are unique: the same heap order);
        with `ordered` False the heapify is left to the caller (`_seed_sets`: one at its end, not
        one per block of sets pushed: 30 per solve over a heap of thousands of sets at 70B / 256 GPUs)."""
        self.sets.extend((bound_s, next(self._order), columns) for columns, bound_s in zip(sets, bounds_s))
        if ordered:
            heapq.heapify(self.sets)

    def push_strategies(self, strategies: Sequence[Strategy], floor_s: float = -math.inf) -> None:
        """Bound and estimate new strategies (see `bounded`); `floor_s` is a bound known to hold
        for all of them (their scheme set's)."""
        fresh = self._unseen(strategies)
        self._seen.update(fresh)
        self.strategies.extend(self.bounded(fresh, floor_s, self.incumbent_s))

    def _unseen(self, strategies: Iterable[Strategy]) -> list[Strategy]:
        """These strategies, once each, but those already enumerated, in order."""
        return [strategy for strategy in dict.fromkeys(strategies) if strategy not in self._seen]

    def mark_seen(self, strategies: Iterable[Strategy]) -> None:
        """Count these strategies as enumerated (a copy of a frontier in a worker process)."""
        self._seen.update(strategies)

    def bounded(self, strategies: Sequence[Strategy], floor_s: float, incumbent_s: float) -> list[Bounded]:
        """The strategies with their bounds and estimates, grouped by scheme set for vectorised
        bounds, in their order within each group; a function of its arguments and the tables."""
        by_schemes: dict[tuple, list[Strategy]] = {}
        for strategy in strategies:
            by_schemes.setdefault(tuple(strategy.schemes), []).append(strategy)
        entries = []
        for schemes, group in by_schemes.items():
            columns = [self.column_of[scheme] for scheme in schemes]
            counts = np.array([[count for _, count in strategy.counts] for strategy in group])
            # the switch cost (>= 0) is left out: the bound stays valid and stays cheap; solving a
            # strategy charges it. The sync depends on the replica count alone within a group.
            replicas = counts @ np.array([scheme.cp for scheme in schemes])
            sync_of = {
                int(count): self.cost.grad_sync_for_replicas_s(int(count), schemes) for count in np.unique(replicas)
            }
            syncs = np.array([sync_of[count] for count in replicas.tolist()])
            dual, bounds = self.tables.count_bounds(columns, counts, cutoff_s=incumbent_s - syncs)
            # estimates only rank strategies: the fluid division by length intervals, with bubbles
            # priced in (`planner.fluid`; the grid dual, never above it, starts its search), for the
            # strategies that can still beat the incumbent; the others are never solved (the
            # incumbent only falls), and their bound stands in
            live = np.flatnonzero(bounds + syncs < incumbent_s)
            fluid = bounds.copy()
            if live.size:
                inflation = _bubble_inflation(self.tables, columns, bounds)
                fluid[live] = interval_fluid_s(self.tables, columns, counts[live], inflation, lower_s=dual[live])
            estimates = np.maximum(fluid, self.tables.pipeline_time_bound_s(columns, self.num_gpus))
            for strategy, bound, estimate, flat, sync in zip(
                group, bounds.tolist(), estimates.tolist(), fluid.tolist(), syncs.tolist()
            ):
                total = max(bound + sync, floor_s)
                entries.append(Bounded(max(estimate + sync, total), flat + sync, total, strategy))
        return entries

    def expansion(self, columns: tuple[int, ...], set_bound_s: float, incumbent_s: float) -> Expansion:
        """A set's strategies (all of them, or those nearest the fluid optimum when there are too
        many to list, then `huge`) not enumerated yet, bounded under `incumbent_s`, the set's
        bound kept as a floor. Changes nothing: `expand_next` applies it. A strategy belongs to one
        set, so only the strategies pushed before the first expansion can have been seen."""
        combo = [self.tables.coefs[column].scheme for column in columns]
        vectors = capped_count_vectors(combo, self.num_gpus, MAX_STRATEGIES_PER_SET)
        huge = vectors is None
        if vectors is None:
            vectors = near_ideal(self.tables.ideal_counts(columns, self.num_gpus), combo, self.num_gpus)
        # `Strategy.of` of each, without its checks: the schemes differ and every count is >= 1
        order = sorted(range(len(combo)), key=lambda index: placement_key(combo[index]))
        canonical = [combo[index] for index in order]
        strategies = [Strategy(tuple(zip(canonical, [counts[index] for index in order]))) for counts in vectors]
        return Expansion(self.bounded(self._unseen(strategies), set_bound_s, incumbent_s), huge)

    def expand_next(self, speculative: SpeculativeSolver | None = None) -> None:
        """Expand the set with the smallest bound into its strategies (`expansion`, or the same
        computed ahead by a worker of `speculative`)."""
        set_bound_s, _, columns = heapq.heappop(self.sets)
        if speculative is not None:
            done = speculative.expansion(self, columns, set_bound_s)
        else:
            done = self.expansion(columns, set_bound_s, self.incumbent_s)
        if done.huge:
            self.floor_s = min(self.floor_s, set_bound_s)
        least_s = min((entry.bound_s for entry in done.entries), default=math.inf)
        self.expanded.append((columns, done.huge, least_s))
        self._seen.update(entry.strategy for entry in done.entries)
        self.strategies.extend(done.entries)

    def next_sets(self, most: int, below_s: float) -> list[tuple[tuple[int, ...], float]]:
        """The (columns, bound) of the next sets `expand_next` would expand, up to `most`, while
        their bound is below `below_s` (the n least of a heap lie in its first 2^n - 1 places)."""
        head = heapq.nsmallest(most, self.sets[: (1 << most) - 1])
        return [(columns, bound_s) for bound_s, _, columns in head if bound_s < below_s]

    def enumerated_rows(self) -> int:
        """Strategies enumerated times the distinct lengths: what bounding them has cost."""
        return len(self.strategies) * len(self.tables.lengths)

    def next_set_bound_s(self) -> float:
        return self.sets[0][0] if self.sets else math.inf

    def lower_bound_s(self) -> float:
        """Valid over the whole space: unexpanded sets, strategies left out of huge sets, and
        every enumerated strategy (solving one does not raise its bound)."""
        enumerated = min((entry.bound_s for entry in self.strategies), default=math.inf)
        return min(self.floor_s, self.next_set_bound_s(), enumerated)


def _bubble_inflation(tables: BoundTables, columns: Sequence[int], bounds: np.ndarray) -> np.ndarray:
    """Per scheme, how much 1F1B inflates a pipeline's work L (an estimate, not a bound): the
    best micro-batch count gives 1 + 2 sqrt((pp-1) c / L), and a pipeline that holds the longest
    item it can take also idles about `LONG_ITEM_BUBBLE_SHARE` x (pp-1) times that item's stage
    time, L ~ the bound."""
    load_s = max(float(np.min(bounds)), 1e-9)
    factors = []
    for column in columns:
        coef = tables.coefs[column]
        bubbles = (coef.scheme.pp - 1) / coef.scheme.v  # interleaving shrinks the bubble v times
        longest = tables.longest_fitting(column)
        long_item_s = LONG_ITEM_BUBBLE_SHARE * bubbles * (coef.a * longest * longest + coef.b * longest + coef.c)
        factors.append(1 + 2 * math.sqrt(bubbles * coef.c / load_s) + long_item_s / load_s)
    return np.array(factors)


def search(
    lengths: np.ndarray,
    cost: ProfileCostModel,
    num_gpus: int,
    settings: SearchSettings,
    clock: Clock,
    time_limit_s: float,
    peers: Callable[[], Sequence[Candidate]] = tuple,
    speculative: SpeculativeSolver | None = None,
) -> SearchResult | None:
    """Best plan found and a valid lower bound on the objective; None when nothing can hold the items.

    `peers()` gives complete solutions made elsewhere (the shipped baselines' own plans of these
    items, `planner.portfolio`), perhaps in another process meanwhile: they join the solved
    candidates when the search proper ends, always (whatever the clock says), and are polished
    like the search's own, so the result is never worse than any of them. Joining at that fixed
    point keeps the plan the same whether they were computed here or in parallel.

    A `speculative` solver (`planner.speculation`) computes ahead, in worker processes, the solves
    at the head of the queue, the expansions of the next scheme sets and the polishes; the search
    takes a result from it only where it would have computed the same thing itself, so the plan is
    the same with or without it.

    Alternates: expand scheme sets (in bound order) whose bound beats the incumbent and the best
    queued estimate, then solve the queued strategy with the best estimate, skipping any whose
    bound cannot beat the incumbent; up to the work limit or the search's share of the time.
    Then the backend polishes the best strategies found.
    """
    search_time_s = clock.remaining_s()  # what the search has, from here to its deadline
    pinned = [strategy for strategy in (*(settings.pool or ()), settings.previous) if strategy is not None]
    pinned = [s for s in pinned if s.num_gpus == num_gpus and all(cost.knows(x) for x in s.schemes)]
    keep = {scheme for strategy in pinned for scheme in strategy.schemes}
    coefs = runnable_schemes(cost, num_gpus, keep)
    tables = BoundTables.build(lengths, coefs)
    frontier = Frontier(tables, cost, num_gpus)
    if settings.pool is not None:
        frontier.push_strategies([s for s in settings.pool if s in pinned])
    else:
        frontier.push_strategies(pinned)
        # homogeneous strategies have high set bounds (one scheme prices every sequence) yet are
        # often near the best: always enumerate them and solve the most promising first
        frontier.push_strategies(_homogeneous(coefs, num_gpus))
    # the time kept after the search proper for the polish (and, beyond the clock, the plan check)
    polish_reserve_s = time_limit_s * (1 - SEARCH_TIME_SHARE.get(settings.backend, 0.6))
    expansion_reserve_s = time_limit_s * (1 - EXPANSION_SHARE)
    slowest_solve_s = 0.0

    def first_solution(strategy: Strategy) -> Candidate | None:
        nonlocal slowest_solve_s
        before = clock.remaining_s()
        screen = speculative.solve if speculative is not None else None
        candidate = _first_solution(strategy, lengths, cost, settings, clock, screen)
        slowest_solve_s = max(slowest_solve_s, before - clock.remaining_s())
        return candidate

    def search_time_up(reserve_s: float = 0.0) -> bool:
        # no solve may start that would eat into the polish's share (the first one always runs)
        return clock.stop(reserve_s=max(polish_reserve_s, slowest_solve_s) + reserve_s)

    # after the first incumbent, the set bounds come before more screening when time is short:
    # without them the global bound falls back to a much looser floor
    seeding_reserve_s = time_limit_s * SEEDING_SHARE if settings.pool is None else 0.0
    solved, done = _initial_incumbents(
        frontier, pinned, first_solution, settings, lambda: search_time_up(seeding_reserve_s), speculative
    )
    if settings.pool is None:
        incumbent_s = solved[0].objective_s if solved else math.inf
        # the set bounds hold the global bound: they may take the polish's share, not the plan check's
        _seed_sets(frontier, coefs, cost, num_gpus, settings.max_schemes, incumbent_s, clock if solved else None)
    attempts = initial_attempts = len(done)
    queue: list[tuple[float, float, str, int]] = []  # unsolved strategies by estimate
    queued = 0
    probes = _Probes(frontier, done)
    expansions = 0
    enumerated_at_solve = len(frontier.strategies)
    if speculative is not None:
        speculative.bind_frontier(frontier)
    while True:
        incumbent_s = frontier.incumbent_s = solved[0].objective_s if solved else math.inf
        most_expansions = settings.work.max_expansions + settings.work.max_extra_expansions
        while frontier.sets and frontier.next_set_bound_s() < incumbent_s and expansions < most_expansions:
            if solved and clock.stop(reserve_s=polish_reserve_s):
                break  # even below MIN_EXPANSIONS: the time limit is hard
            if expansions >= MIN_EXPANSIONS and clock.stop(reserve_s=expansion_reserve_s):
                break
            if expansions >= MIN_EXPANSIONS and queue and frontier.next_set_bound_s() >= queue[0][0]:
                break
            if len(frontier.strategies) - enumerated_at_solve >= STRATEGIES_PER_SOLVE:
                break  # at scale (a thousand strategies a set) solves must not wait for every expansion
            if expansions >= settings.work.max_expansions and (
                frontier.enumerated_rows() >= settings.work.max_enumerated_rows
                or len(frontier.strategies) >= settings.work.max_enumerated
            ):
                break  # cheap expansions go on (few strategies over few lengths), costly ones stop
            if speculative is not None:  # the sets this loop will likely expand next, in workers
                speculative.prefetch_expansions(frontier.next_sets(QUEUE_HEAD, incumbent_s), incumbent_s)
            frontier.expand_next(speculative)
            expansions += 1
            if (
                PROBE_EVERY
                and expansions % PROBE_EVERY == 0
                and expansions <= settings.work.max_expansions  # at most 4 probes at the default budget
                and attempts == initial_attempts
                and solved
                # read, not `stop()`: a probe skipped for time changes no plan, so it is no cut
                and clock.remaining_s() > max(polish_reserve_s, slowest_solve_s)
            ):
                probes.solve_best(incumbent_s, first_solution)
                if (
                    len(probes.polished) < EARLY_POLISHES
                    and settings.backend in EARLY_POLISHED_BACKENDS
                    and clock.remaining_s() < (1 - EARLY_POLISH_AFTER_SHARE) * search_time_s
                ):
                    probes.polish_best(solved, lambda c: polish_candidate(c, lengths, cost, settings, clock))
        for entry in frontier.strategies[queued:]:
            heapq.heappush(queue, _queue_key(entry, queued))
            queued += 1
        while queue and (
            frontier.strategies[queue[0][3]].bound_s >= incumbent_s or frontier.strategies[queue[0][3]].strategy in done
        ):
            heapq.heappop(queue)
        if not queue or (solved and attempts >= settings.max_strategies_solved):
            break
        if solved and (
            search_time_up()
            if attempts - initial_attempts >= MIN_SEARCH_SOLVES
            else clock.stop(reserve_s=slowest_solve_s)
        ):
            break
        entry = frontier.strategies[heapq.heappop(queue)[3]]
        if speculative is not None:
            speculative.prefetch(_queue_head(queue, frontier, incumbent_s, done))
        attempts += 1
        enumerated_at_solve = len(frontier.strategies)
        if entry.strategy in probes.kept:
            candidate = probes.kept.pop(entry.strategy)
        else:
            candidate = first_solution(entry.strategy)
        if candidate is not None:
            solved.append(candidate)
            solved.sort(key=lambda c: (c.objective_s, str(c.strategy)))
    if clock.cut:  # the clock, not the work limits, ended the search: what the probes found counts
        solved.extend(candidate for candidate in probes.kept.values() if candidate is not None)
    if settings.pool is None and not clock.cut:  # screened against screened: before the peers join
        solved = _count_moves(solved, first_solution, settings.work.count_moves, search_time_up)
    solved = sorted([*solved, *peers()], key=lambda c: (c.objective_s, str(c.strategy)))
    if not solved:
        return None
    best = _polish(
        solved, lengths, cost, settings, clock, POLISH_PER_SCREEN * slowest_solve_s, speculative, probes.polished
    )
    if speculative is not None:
        speculative.close()
    if settings.thorough and settings.backend != SolverBackend.GREEDY:
        # what is left beyond the bounds' reserve goes to the packing of the slowest pipelines
        def enough() -> bool:
            return clock.stop(reserve_s=time_limit_s * BOUND_RESERVE_SHARE)

        polished = polish_packings(best, lengths, settings.work.packing_evaluations, enough)
        if polished is not best:  # faster pipelines may now take items from the slowest
            best = refine(polished, lengths, settings.work.refine_rounds, enough)
    best = _tighten_bounds(frontier, best, lengths, settings, clock)
    lower_bound_s = frontier.lower_bound_s()  # uncapped: the checker refuses one above the objective
    runners_up = tuple(c.strategy for c in solved if c.strategy != best.strategy)[:NUM_RUNNERS_UP]
    space = "search" if settings.pool is None else "pool"
    certificate = build_certificate(frontier, space, settings.max_schemes, lower_bound_s)
    return SearchResult(
        best, runners_up, lower_bound_s, len(coefs), len(frontier.strategies), attempts, clock.cut, certificate
    )


def _initial_incumbents(
    frontier: Frontier,
    pinned: list[Strategy],
    first_solution: Callable[[Strategy], Candidate | None],
    settings: SearchSettings,
    time_up: Callable[[], bool],
    speculative: SpeculativeSolver | None = None,
) -> tuple[list[Candidate], set[Strategy]]:
    """Solve the previous strategy and the most promising homogeneous ones (see module docstring)
    until `time_up()` once one is solved. Returns the solved candidates, best first, and the
    strategies tried."""
    first: list[Strategy] = []
    if settings.pool is None:
        homogeneous = [entry for entry in frontier.strategies if len(entry.strategy.counts) == 1]
        homogeneous.sort(key=lambda e: (e.estimate_s, str(e.strategy)))
        first = [entry.strategy for entry in homogeneous[:NUM_HOMOGENEOUS_FIRST]]
        if settings.previous in pinned:
            first.insert(0, settings.previous)  # staying costs no re-sharding: a natural incumbent
    solved: list[Candidate] = []
    tried: set[Strategy] = set()
    ordered = list(dict.fromkeys(first))
    for index, strategy in enumerate(ordered):
        if solved and time_up():
            break
        if speculative is not None:
            speculative.prefetch(ordered[index + 1 :])
        tried.add(strategy)
        candidate = first_solution(strategy)
        solved += [candidate] if candidate is not None else []
    solved.sort(key=lambda c: (c.objective_s, str(c.strategy)))
    return solved, tried


def _count_moves(
    solved: list[Candidate],
    first_solution: Callable[[Strategy], Candidate | None],
    most: int,
    time_up: Callable[[], bool],
) -> list[Candidate]:
    """Descend from the best solved strategy (`solved` is best first) with several schemes, one of
    MANY_PIPELINES pipelines or more: move GPUs from one scheme to another, a step of
    COUNT_MOVE_STEPS groups of `lcm` GPUs at a time (largest first, each kept while it pays), solving
    each move, up to `most` solves or `time_up()`. `solved` are screened candidates
    (`first_solution`), as the moves are. Returns `solved` with the moves' candidates."""
    best = next(
        (c for c in solved if len(c.strategy.counts) > 1 and max(n for _, n in c.strategy.counts) >= MANY_PIPELINES),
        None,
    )
    tried = {candidate.strategy for candidate in solved}
    found: list[Candidate] = []
    left = most if best is not None else 0
    for step in COUNT_MOVE_STEPS:
        improved = True
        while improved and left > 0:
            improved = False
            for move in _moves(best.strategy, step):
                if left <= 0 or time_up():
                    left = 0
                    break
                if move in tried:
                    continue
                tried.add(move)
                left -= 1
                candidate = first_solution(move)
                if candidate is None:
                    continue
                found.append(candidate)
                if candidate.objective_s < best.objective_s:
                    best, improved = candidate, True
                    break
    return sorted([*solved, *found], key=lambda c: (c.objective_s, str(c.strategy)))


def _moves(strategy: Strategy, step: int) -> list[Strategy]:
    """The strategies `step` groups of lcm(g_a, g_b) GPUs away: from scheme b to scheme a, for each
    ordered pair (in the strategy's order), keeping at least one pipeline of each."""
    counts = list(strategy.counts)
    moves = []
    for a, (scheme_a, count_a) in enumerate(counts):
        for b, (scheme_b, count_b) in enumerate(counts):
            if a == b:
                continue
            group = math.lcm(scheme_a.num_gpus, scheme_b.num_gpus) * step
            removed = group // scheme_b.num_gpus
            if removed >= count_b:
                continue
            moved = dict(counts)
            moved[scheme_a] = count_a + group // scheme_a.num_gpus
            moved[scheme_b] = count_b - removed
            moves.append(Strategy.of(moved))
    return moves


def _queue_key(entry: Bounded, index: int) -> tuple[float, float, str, int]:
    """The order the search solves enumerated strategies in (best estimate first, ties by the
    fluid estimate, then the text), `index` being the entry's place in `Frontier.strategies`;
    the probes follow the same order."""
    return (round(entry.estimate_s, 3), entry.fluid_estimate_s, str(entry.strategy), index)


class _Probes:
    """Strategies solved ahead of the search's own order (`PROBE_EVERY`): `kept` maps each to its
    candidate (None where it had none) until the search reaches it."""

    def __init__(self, frontier: Frontier, done: set[Strategy]) -> None:
        self.frontier, self.done = frontier, done
        self.kept: dict[Strategy, Candidate | None] = {}
        # (candidate, its polish) of `polish_best`: the very candidate object, so the polish at the
        # end takes it for that candidate alone
        self.polished: list[tuple[Candidate, Candidate]] = []
        self._heap: list[tuple[float, float, str, int]] = []  # the search queue's order
        self._pushed = 0

    def solve_best(self, incumbent_s: float, solve: Callable[[Strategy], Candidate | None]) -> None:
        """Solve the best-estimated strategy enumerated so far that the search could still solve
        (bound below the incumbent, neither tried nor probed); nothing if there is none."""
        strategies = self.frontier.strategies
        for index in range(self._pushed, len(strategies)):
            entry = strategies[index]
            heapq.heappush(self._heap, _queue_key(entry, index))
        self._pushed = len(strategies)
        while self._heap:
            entry = strategies[heapq.heappop(self._heap)[3]]
            if entry.bound_s < incumbent_s and entry.strategy not in self.done and entry.strategy not in self.kept:
                self.kept[entry.strategy] = solve(entry.strategy)
                return

    def polish_best(self, solved: Sequence[Candidate], polish: Callable[[Candidate], Candidate]) -> None:
        """Polish ahead the best candidate among `solved` and the probes', unless it already was
        (see EARLY_POLISHES)."""
        found = [*solved, *(candidate for candidate in self.kept.values() if candidate is not None)]
        if found:
            best = min(found, key=lambda c: (c.objective_s, str(c.strategy)))
            if all(source is not best for source, _ in self.polished):
                self.polished.append((best, polish(best)))


def _queue_head(queue: list, frontier: Frontier, incumbent_s: float, done: set[Strategy]) -> list[Strategy]:
    """The strategies the search would solve next if the incumbent stayed as it is, best first:
    the least entries of the queue's heap (the n least of a heap lie in its first 2^n - 1
    places) that can still beat the incumbent."""
    head = heapq.nsmallest(QUEUE_HEAD, queue[: (1 << QUEUE_HEAD) - 1])
    strategies = [frontier.strategies[index] for *_, index in head]
    return [entry.strategy for entry in strategies if entry.bound_s < incumbent_s and entry.strategy not in done]


def _homogeneous(coefs: Sequence[SchemeCoefficients], num_gpus: int) -> list[Strategy]:
    """Every strategy of one scheme that fills the cluster."""
    return [
        Strategy.of([(coef.scheme, num_gpus // coef.scheme.num_gpus)])
        for coef in coefs
        if num_gpus % coef.scheme.num_gpus == 0
    ]


def solve_fixed(
    strategy: Strategy, lengths: np.ndarray, cost: ProfileCostModel, settings: SearchSettings, clock: Clock
) -> Candidate | None:
    """One strategy, solved the way the backend solves the best strategies of a search."""
    candidate = _first_solution(strategy, lengths, cost, settings, clock)
    if candidate is None:
        return None
    return _polish([candidate], lengths, cost, settings, clock)


def _seed_sets(
    frontier: Frontier,
    coefs,
    cost,
    num_gpus: int,
    max_schemes: int,
    incumbent_s: float,
    clock: Clock | None = None,
) -> None:
    """Queue every fillable scheme set with its bound. Items are priced with the bubble floors
    valid for pipelines that finish within the incumbent's step time: a plan of the set is either
    no better than the incumbent or obeys that pricing, so min(incumbent, bound) is valid.

    The bounds come one first scheme's subtree at a time (`BoundTables.set_bound_blocks`,
    compiled: ~30 ms for the 4,390 sets of 70B / 256 GPUs). With a `clock` that says stop between
    blocks, the sets not listed yet are left out and the frontier's floor takes a bound no such
    set's bound is below (`_unlisted_floor_s`): the global bound stays valid, only looser."""
    sizes = [coef.scheme.num_gpus for coef in coefs]
    tables = frontier.tables
    if len(tables.lengths) > EXACT_SET_BOUND_MAX_LENGTHS:
        tables = tables.coarsened()
    priced = tables.bubble_priced(incumbent_s)
    sync_floors = SyncFloors(cost, coefs, num_gpus)
    # a set that cannot beat the incumbent with the least sync of any set never matters
    cutoff_s = incumbent_s - sync_floors.least()
    frontier.set_pricing = (priced, sync_floors, incumbent_s)
    fillable_children: dict[tuple[int, ...], np.ndarray] = {}  # per sorted prefix sizes, per column
    blocks: list[tuple[tuple[int, ...], np.ndarray, np.ndarray]] = []
    for block in priced.set_bound_blocks(max_schemes, num_gpus, cutoff_s):
        if clock is not None and clock.stop():
            unlisted_s = _unlisted_floor_s(priced, block[0], num_gpus) + sync_floors.least()
            frontier.floor_s = min(frontier.floor_s, incumbent_s, unlisted_s)
            break
        blocks.append(block)
        if len(blocks) == SEEDED_BLOCKS_PER_PUSH:  # pushed as they come: little is left after a stop
            _push_seeded(frontier, blocks, sizes, num_gpus, sync_floors, incumbent_s, fillable_children)
            blocks = []
    _push_seeded(frontier, blocks, sizes, num_gpus, sync_floors, incumbent_s, fillable_children)
    heapq.heapify(frontier.sets)  # once: the pushes above left it to here


def _unlisted_floor_s(tables: BoundTables, prefix: tuple[int, ...], num_gpus: int) -> float:
    """A floor under the bound (without sync) of every set listed by the block of `prefix` or a
    later one of `BoundTables.set_bound_blocks`, whose prefixes come in lexicographic order, each
    before its children's: such a set is the prefix and later columns, or the prefix's first l
    columns and then only columns after its (l+1)-th. Over a superset of a set's columns the
    area and longest-item bounds can only fall. Tighter than all columns at once: cut at 90% of
    the blocks at 1,024 GPUs, the global bound fell 8% short of full seeding instead of 16%."""
    num_columns = tables.gpu_seconds.shape[1]
    supersets = [[*prefix[:level], *range(prefix[level] + 1, num_columns)] for level in range(len(prefix))]
    supersets.append([*prefix, *range(prefix[-1] + 1 if prefix else 0, num_columns)])
    return min(tables.pipeline_time_bound_s(columns, num_gpus) for columns in supersets if columns)


def _push_seeded(frontier: Frontier, blocks, sizes, num_gpus: int, sync_floors, incumbent_s: float, fillable_children):
    """Queue the sets of these blocks of `BoundTables.set_bound_blocks` that can fill the cluster
    (which depends on the sizes of the prefix and of the child alone), each with its bound plus
    its sync floor, at most the incumbent: all of them at once."""
    if not blocks:
        return
    masks = []
    for prefix, children, _ in blocks:
        key = tuple(sorted(sizes[column] for column in prefix))
        if key not in fillable_children:
            fillable_children[key] = np.array([fillable(tuple(sorted([*key, size])), num_gpus) for size in sizes])
        masks.append(fillable_children[key][children])
    keep = np.concatenate(masks)
    block_of = np.repeat(np.arange(len(blocks)), [len(children) for _, children, _ in blocks])[keep]
    children = np.concatenate([children for _, children, _ in blocks])[keep]
    bounds = np.concatenate([bounds for _, _, bounds in blocks])[keep]
    prefixes = [prefix for prefix, _, _ in blocks]
    totals = np.minimum(bounds + sync_floors.extended_blocks(prefixes, block_of, children), incumbent_s)
    frontier.push_sets(
        [(*prefixes[block], child) for block, child in zip(block_of.tolist(), children.tolist())],
        totals.tolist(),
        ordered=False,
    )


def _tighten_bounds(
    frontier: Frontier, best: Candidate, lengths: np.ndarray, settings: SearchSettings, clock: Clock
) -> Candidate:
    """Raise the bounds that hold the global bound down, least first, in batches up to work
    limits: unexpanded sets with the replica-coupled and packing set bounds, enumerated strategies
    with the packing bound (`BoundTables.packing_bounds`) and, for batches of a few items, the
    assignment bound (`planner.few_items`), whichever holds the least bound. A set that still
    holds it after its own refinement is expanded so that its strategies can be: with a few items
    always, else with budgets of 4 s and more while the strategies enumerated stay under the
    search's own limit (`max_enumerated_rows`).
    The assignment bound's best assignments are plans too: returns the best candidate."""
    incumbent_s = best.objective_s
    refined_sets: set[tuple[int, ...]] = set()
    refined_strategies: set[Strategy] = set()
    expansions = 0
    fruitless = False
    steps_left = settings.work.bound_steps

    def should_stop() -> bool:  # one step of a bound: the work limit first, the clock as safety net
        nonlocal steps_left
        steps_left -= 1
        return steps_left < 0 or clock.stop()

    # only from twice the default's work on (a budget of 4 s and more): at the default's steps,
    # patches at every bisection step took the steps the sets' bounds needed (3 of 12 32B Wikipedia
    # bounds fell at 2 s; none at 10 s, with 5x the steps), and the refined duals took 10% more CPU
    # on the 32B batches that already need most of the 2 s; the mixed functions and the expansions
    # of many items' sets took 8B / 64 H100 LongAlign batches from 1.1-1.2 s to 1.4-2.3 s of CPU
    deeper = settings.work.bound_steps >= 2 * MAX_BOUND_STEPS

    few = frontier.tables.num_items <= FEW_ITEMS
    while steps_left >= 0 and not clock.stop():
        waiting, held_s = _waiting_and_held(frontier, refined_strategies, incumbent_s)
        least_set_s = frontier.next_set_bound_s()
        if not few and _held_beyond_reach(held_s, least_set_s, waiting):
            break  # with a few items the assignment bounds may still find better plans
        if (
            frontier.set_pricing is not None
            and least_set_s < incumbent_s
            and (not waiting or least_set_s <= min(waiting)[0])
        ):
            if frontier.sets[0][2] not in refined_sets and len(refined_sets) < settings.work.max_refined_sets:
                _refine_set_batch(frontier, incumbent_s, refined_sets, should_stop)
                continue
            many = (
                deeper
                and frontier.floor_s > least_set_s  # a huge set's expansion left its bound standing
                and frontier.enumerated_rows() < settings.work.max_enumerated_rows
            )
            if (few or many) and expansions < settings.work.max_bound_expansions:
                # a set bound cannot see which items share a pipeline: its strategies' bounds can,
                # for a few items the assignment bound, else the packing bound (a step each)
                if not few and should_stop():
                    break
                frontier.expand_next()
                expansions += 1
                continue
        if (
            not waiting
            or len(refined_strategies) >= settings.work.max_packing_bounded
            or fruitless
            or not settings.thorough
        ):
            break  # brief settings (e.g. a service's 0.1 s) keep their time for throughput
        batch = [index for _, index in heapq.nsmallest(PACKING_BOUNDED_PER_BATCH, waiting)]
        refined_strategies.update(frontier.strategies[index].strategy for index in batch)
        before = [frontier.strategies[index].bound_s for index in batch]
        promising = _pack_bound_batch(frontier, batch, incumbent_s, lengths, should_stop, deeper)
        # the least bounds gained nothing: the next ones, alike but higher, will not matter either
        fruitless = all(frontier.strategies[i].bound_s <= b * (1 + 1e-9) for i, b in zip(batch, before))
        for strategy, assignment in promising:
            coefs = tuple(frontier.cost.coefficients(scheme) for scheme in strategy.pipeline_schemes())
            candidate = packed_candidate(strategy, coefs, assignment, lengths, frontier.cost, settings.previous)
            if candidate.objective_s < best.objective_s:
                # a few items only: polishing its packing and refining it is cheap
                candidate = polish_packings(candidate, lengths, settings.work.packing_evaluations, clock.stop)
                best = refine(candidate, lengths, settings.work.refine_rounds, clock.stop)
                incumbent_s = best.objective_s
    return best


def _waiting_and_held(
    frontier: Frontier, refined: set[Strategy], incumbent_s: float
) -> tuple[list[tuple[float, int]], float]:
    """In one pass over the enumerated strategies: those the tightening may still raise (below the
    incumbent, not raised yet), as (bound, index), and the least bound it can no longer raise (a
    strategy it raised already, or the floor of huge sets)."""
    waiting = []
    held_s = frontier.floor_s
    for index, entry in enumerate(frontier.strategies):
        if entry.strategy in refined:
            held_s = min(held_s, entry.bound_s)
        elif entry.bound_s < incumbent_s:
            waiting.append((entry.bound_s, index))
    return waiting, held_s


def _held_beyond_reach(held_s: float, least_set_s: float, waiting: list[tuple[float, int]]) -> bool:
    """Whether the least bound the tightening can no longer raise, `held_s`, holds the global bound
    at or below every bound it could still raise (the least set's, `least_set_s`, and the `waiting`
    strategies'): the rest of its steps would raise only bounds above it (32B / 64 A100 SFT mix at
    10 s: 2 s of CPU for the same global bound)."""
    return held_s <= least_set_s and (not waiting or held_s <= min(waiting)[0])


def _refine_set_batch(
    frontier: Frontier,
    incumbent_s: float,
    refined: set[tuple[int, ...]],
    should_stop: Callable[[], bool],
) -> None:
    """Re-bound the least unexpanded sets with the replica-coupled set bound
    (`BoundTables.replica_split_bounds_s`) and the set packing bound
    (`BoundTables.set_packing_bounds_s`, which stops early when `should_stop()` says so)."""
    assert frontier.set_pricing is not None
    tables, sync_floors, cap_s = frontier.set_pricing
    batch = []
    while frontier.sets and len(batch) < REFINED_SETS_PER_BATCH:
        bound_s, _, columns = frontier.sets[0]
        if bound_s >= incumbent_s or columns in refined:
            break
        batch.append(heapq.heappop(frontier.sets)[::2])
    if not batch:
        return
    sets = [columns for _, columns in batch]
    better = tables.replica_split_bounds_s(sets, frontier.num_gpus, sync_floors)
    raised = np.maximum([bound_s for bound_s, _ in batch], np.minimum(cap_s, better))
    # the packing bound needs a row per length: the exact tables, not the coarsened pricing
    raised = frontier.tables.set_packing_bounds_s(sets, frontier.num_gpus, sync_floors, raised, cap_s, should_stop)
    for columns, value in zip(sets, raised.tolist()):
        refined.add(columns)
        frontier.push_set(columns, value)


def _pack_bound_batch(
    frontier: Frontier,
    batch: list[int],
    incumbent_s: float,
    lengths: np.ndarray,
    should_stop: Callable[[], bool],
    deeper: bool = False,
) -> list[tuple[Strategy, tuple[np.ndarray, ...]]]:
    """Raise the bounds of these enumerated strategies (indices): for batches of a few items by
    the assignment bound (`planner.few_items`, exact given the pipeline floors, so at least the
    packing bound), else (or when it runs out of nodes) by the packing bound, its multipliers
    searched off the grid at the probe. `deeper` (longer budgets) also searches them at every
    bisection step and first raises the strategies by the fluid and bubble-floor duals at
    multipliers searched off their grid (`BoundTables.refined_dual_bounds`). Returns the
    assignments that attain an assignment bound below the incumbent (plans worth building)."""
    promising: list[tuple[Strategy, tuple[np.ndarray, ...]]] = []
    tables = frontier.tables
    few = tables.num_items <= FEW_ITEMS
    by_schemes: dict[tuple, list[int]] = {}
    for index in batch:
        by_schemes.setdefault(tuple(frontier.strategies[index].strategy.schemes), []).append(index)
    for schemes, indices in by_schemes.items():
        if should_stop():
            break
        sync = {index: strategy_sync_s(frontier.cost, frontier.strategies[index].strategy) for index in indices}
        raised: dict[int, float] = {}
        proofs: dict[int, tuple[tuple[float, ...], tuple[str, ...] | None]] = {}
        for index in indices if few else ():
            strategy = frontier.strategies[index].strategy
            pipelines = [tables.coefs[frontier.column_of[scheme]] for scheme in strategy.pipeline_schemes()]
            exact = few_items_bound(pipelines, lengths, incumbent_s - sync[index], should_stop)
            if exact is not None:
                raised[index] = exact.bound_s + sync[index]
                if exact.assignment is not None:
                    promising.append((strategy, exact.assignment))
        rest = [index for index in indices if index not in raised]
        if rest:
            entries = [frontier.strategies[index] for index in rest]
            columns = [frontier.column_of[scheme] for scheme in schemes]
            counts = np.array([[count for _, count in entry.strategy.counts] for entry in entries])
            syncs = np.array([sync[index] for index in rest])
            bounds = np.array([entry.bound_s for entry in entries])
            duals, dual_witnesses = bounds - syncs, np.full((len(rest), len(columns)), np.nan)
            if deeper:
                duals, dual_witnesses = tables.refined_dual_bounds(columns, counts, duals, should_stop)
            packed, witnesses, functions = tables.packing_bounds(
                columns,
                counts,
                duals,
                incumbent_s - syncs,
                should_stop=should_stop,
                closer_every_step=deeper,
                mixed_functions=deeper,
            )
            for index, value, packing, mixed, dual in zip(
                rest, (packed + syncs).tolist(), witnesses, functions, dual_witnesses
            ):
                raised[index] = value
                # the multipliers of the last bound that raised it: the packing's (with its functions
                # where it mixed them), else the duals'
                if not np.isnan(packing).any():
                    names = tuple(DFF_NAMES[f] for f in mixed.tolist()) if mixed[0] >= 0 else None
                    proofs[index] = (tuple(packing.tolist()), names)
                elif not np.isnan(dual).any():
                    proofs[index] = (tuple(dual.tolist()), None)
        for index, value in raised.items():
            entry = frontier.strategies[index]
            if value > entry.bound_s:
                witness, names = proofs.get(index, (entry.witness, entry.functions))
                frontier.strategies[index] = dataclasses.replace(entry, bound_s=value, witness=witness, functions=names)
    return promising


def _first_solution(
    strategy, lengths, cost, settings: SearchSettings, clock: Clock, screen: Callable | None = None
) -> Candidate | None:
    """Screen a strategy: greedy (`screen(strategy)`, by default `solve_strategy` here), or the
    exact joint MILP when the instance is tiny."""
    if screen is None:
        candidate = solve_strategy(strategy, lengths, cost, settings.previous)
    else:
        candidate = screen(strategy)
    if settings.backend in (SolverBackend.CPSAT, SolverBackend.PULP) and len(lengths) <= 12:
        exact = milp_candidate(settings.backend.value, strategy, lengths, cost, settings, clock, candidate)
        if exact is not None and (candidate is None or exact.objective_s < candidate.objective_s):
            candidate = exact
    if candidate is not None and not math.isfinite(candidate.objective_s):
        return None  # e.g. an interleaved pipeline whose packing found no count its schedule runs
    return candidate


def _polish(
    solved: list[Candidate],
    lengths,
    cost,
    settings: SearchSettings,
    clock: Clock,
    expected_s: float = 0.0,
    speculative: SpeculativeSolver | None = None,
    ahead_of_time: Sequence[tuple[Candidate, Candidate]] = (),
) -> Candidate:
    """Apply the backend's dispatch to the best strategies found, each followed by joint
    refinement (`polish_candidate`; with `speculative`, those after the first in workers ahead).
    A polish starts only if the time left covers `expected_s` (what screening one strategy took)
    or, after the first, what the last polish took; one done `ahead_of_time` ((candidate,
    polish) pairs, matched by identity) is taken whatever the clock says."""
    best = solved[0]
    if settings.backend == SolverBackend.GREEDY:
        return best
    chosen = solved[: settings.work.polished if settings.thorough else NUM_POLISHED_BRIEF]
    # the MILP backends' polish is capped by the wall clock, as a worker's would be by its own
    ahead = speculative is not None and settings.backend in (SolverBackend.LP, SolverBackend.AUTO)
    if ahead:
        speculative.prefetch_polishes(list(enumerate(chosen))[1:], settings, clock)
    for index, candidate in enumerate(chosen):
        done = next((polished for source, polished in ahead_of_time if source is candidate), None)
        if done is not None:
            if done.objective_s < best.objective_s:
                best = done
            continue
        if clock.stop(reserve_s=expected_s):
            break
        before = clock.remaining_s()
        if ahead:
            improved = speculative.polish(index, candidate, settings, clock)
        else:
            improved = polish_candidate(candidate, lengths, cost, settings, clock)
        expected_s = before - clock.remaining_s()
        if improved.objective_s < best.objective_s:
            best = improved
    best = refine(best, lengths, settings.work.refine_rounds, clock.stop)
    small = len(lengths) * best.strategy.num_pipelines <= AUTO_MILP_MAX_VARIABLES
    affordable = settings.milp_budget_s >= AUTO_MILP_MIN_BUDGET_S
    if settings.backend == SolverBackend.AUTO and small and affordable and not clock.stop(settings.milp_budget_s):
        polished = milp_candidate("cpsat", best.strategy, lengths, cost, settings, clock, best)
        if polished is not None and polished.objective_s < best.objective_s:
            best = refine(
                dataclasses.replace(polished, origin=best.origin), lengths, settings.work.refine_rounds, clock.stop
            )
    return best


def polish_candidate(candidate: Candidate, lengths, cost, settings: SearchSettings, clock: Clock) -> Candidate:
    """One of the best strategies polished: the backend's dispatch, then a few refinement rounds
    (which strategy is best often shows only after them)."""
    polished = dataclasses.replace(_polish_one(candidate, lengths, cost, settings, clock), origin=candidate.origin)
    return refine(polished, lengths, settings.work.refine_rounds_each if settings.thorough else 0, clock.stop)


def _polish_one(candidate: Candidate, lengths, cost, settings: SearchSettings, clock: Clock) -> Candidate:
    options = [candidate]
    if settings.backend in (SolverBackend.LP, SolverBackend.AUTO):
        options.append(lp_candidate(candidate, lengths, cost, settings.previous))
    if settings.backend in (SolverBackend.CPSAT, SolverBackend.PULP):
        options.append(
            milp_candidate(settings.backend.value, candidate.strategy, lengths, cost, settings, clock, candidate)
        )
    return min((option for option in options if option is not None), key=lambda c: c.objective_s)


def _inflation(candidate: Candidate, lengths: np.ndarray) -> list[float]:
    """True pipeline time over raw stage work, per pipeline of the candidate (>= 1)."""
    return [
        max(1.0, packed.time_s / max(float(coef.work_s(lengths[items]).sum()), 1e-12))
        for coef, items, packed in zip(candidate.coefs, candidate.assignment, candidate.packed)
    ]


def lp_candidate(candidate: Candidate, lengths, cost, previous) -> Candidate | None:
    """Re-dispatch a candidate's strategy by LP relaxation + rounding, with its packing inflation."""
    by_type: dict[SchemeCoefficients, list[float]] = {}
    for coef, factor in zip(candidate.coefs, _inflation(candidate, lengths)):
        by_type.setdefault(coef, []).append(factor)
    inflation = {coef: float(np.mean(factors)) for coef, factors in by_type.items()}
    assignment = lp_dispatch(lengths, candidate.coefs, inflation)
    if assignment is None:
        return None
    return packed_candidate(candidate.strategy, candidate.coefs, assignment, lengths, cost, previous)


def milp_candidate(backend, strategy, lengths, cost, settings: SearchSettings, clock: Clock, hint: Candidate | None):
    """Dispatch (or, for tiny batches, dispatch + packing) by MILP; None when the model is too
    large to build (building is outside the MILP's own limit: 1,024 GPUs and 16K sequences make
    3.9M variables, minutes of model building).

    The MILP's work limit is `settings.milp_budget_s` (CP-SAT's deterministic time); the time
    left only caps its wall time as a safety net, and a solve (or a model not built) that the
    wall clock decided is a cut of the search (`Clock.note_cut`)."""
    coefs = tuple(cost.coefficients(scheme) for scheme in strategy.pipeline_schemes())
    sorted_lengths = np.sort(lengths)
    variables = int(np.searchsorted(sorted_lengths, [coef.capacity_tokens for coef in coefs], side="right").sum())
    build_s = variables * MILP_BUILD_S_PER_VARIABLE.get(backend, max(MILP_BUILD_S_PER_VARIABLE.values()))
    if variables > MILP_ALWAYS_BUILT_VARIABLES and build_s > settings.milp_budget_s:
        return None  # a work limit: building would take longer than the solve may
    wall_limit_s = max(0.05, min(clock.remaining_s() * 0.5, settings.milp_budget_s * MILP_WALL_SLACK))
    if variables > MILP_ALWAYS_BUILT_VARIABLES and build_s + settings.milp_budget_s > clock.remaining_s():
        clock.note_cut()
        return None
    inflation = _inflation(hint, lengths) if hint is not None else None
    result = solve_milp(
        backend,
        lengths,
        coefs,
        settings.milp_budget_s,
        settings.seed,
        inflation,
        hint.assignment if hint is not None else None,
        wall_limit_s=wall_limit_s,
        on_wall_cut=clock.note_cut,
    )
    if result is None or any(len(items) == 0 for items in result.assignment):
        return None
    packed = None
    if result.micro_batches is not None:
        packed = tuple(
            _packed_from_batches(batches, lengths, coef) for batches, coef in zip(result.micro_batches, coefs)
        )
    return packed_candidate(strategy, coefs, result.assignment, lengths, cost, settings.previous, packed)


def _packed_from_batches(batches: list[np.ndarray], lengths: np.ndarray, coef: SchemeCoefficients) -> PackedPipeline:
    times = [coef.micro_batch_time_s(lengths[b]) for b in batches]
    return best_order(batches, times, coef)
