"""Never behind a peer: the shipped baselines' own plans as candidates of the search.

Every baseline of `planner.baselines` (megatron, wlb, flexsp, hydraulis, and the interleaved
megatron-vpp and wlb-vpp where the profile prices their recipe's chunk counts) plans exactly the
search's items (the same sequences, cut the same way), in a worker process while the search runs
(`solve(executor=...)`) or when the search asks; each plan it makes joins the search's solved
candidates when the search proper ends and is polished like them (LP re-dispatch, refinement,
packing search). The search only ever replaces its best candidate by a better one, and no clock
or work limit skips this step, so the returned plan's objective (step time plus switch cost) is
never above any of these plans' at any budget; joining at a fixed point keeps the plan the same
with or without a worker. A baseline that cannot
hold the items as they are (its largest capacity is below a sequence the search keeps whole) has
no plan of the same batch to compare with and is left out. `SolverStats.winner` names the
candidate the returned plan grew from.

Cost (CPU, quiet 2-core EPYC, the four together): ~0.15 s at 8B / 64 H100 (1M tokens), ~0.45 s at
70B / 256 H100 (4M tokens), ~2.5 s at 8B / 1,024 H100 (16M tokens).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hydraplan.planner.baselines import BASELINES, peer_choice
from hydraplan.planner.candidate import Candidate
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile
from hydraplan.planner.strategies import Strategy, parse_strategy
from hydraplan.planner.switching import pipeline_blocks, switch_cost_s

PEERS = tuple(BASELINES)


def peer_candidates(
    lengths: np.ndarray,
    cost: ProfileCostModel,
    num_gpus: int,
    max_schemes: int,
    seed: int,
    previous: Strategy | None,
    names: tuple[str, ...] = PEERS,
) -> list[Candidate]:
    """Each baseline's plan of these items as a solver candidate (origin: its name), priced with
    the switch from `previous` as the search prices its own."""
    candidates = []
    for name in names:
        candidate = peer_choice(name, lengths, cost, num_gpus, max_schemes, seed).candidate
        if candidate is None:
            continue
        switch_s = switch_cost_s(previous, pipeline_blocks(candidate.strategy), cost) if previous else 0.0
        candidates.append(dataclasses.replace(candidate, switch_cost_s=switch_s, origin=name))
    return candidates


def peer_task(
    profile: CostProfile,
    lengths: np.ndarray,
    num_gpus: int,
    max_schemes: int,
    seed: int,
    previous_strategy: str | None,
) -> list[Candidate]:
    """`peer_candidates` from picklable arguments, for a worker process (`solve(executor=...)`)."""
    previous = parse_strategy(previous_strategy) if previous_strategy else None
    return peer_candidates(lengths, ProfileCostModel(profile), num_gpus, max_schemes, seed, previous)
