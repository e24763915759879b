"""Reference costs for the independent checker: short, obviously correct, written apart from the
solver.

Nothing here imports the solver's cost model, simulator, strategy or switching code: every
quantity a plan reports is recomputed from the plan's cost profile by the definitions of
DESIGN.md, in the plainest form that a reader can verify by eye. It may be slower than the
solver's code; `tests/test_check.py` compares the two on random inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

from hydraplan.planner.schemas import LONGEST_POWER, CostProfile, SchemeCost

Scheme = tuple[int, ...]  # (tp, pp, cp), or (tp, pp, cp, v) with v > 1 model chunks per PP rank


def full_scheme(scheme: Scheme) -> tuple[int, int, int, int]:
    """(tp, pp, cp, v), v = 1 when left out."""
    return (scheme[0], scheme[1], scheme[2], scheme[3] if len(scheme) > 3 else 1)


def short_scheme(tp: int, pp: int, cp: int, v: int = 1) -> Scheme:
    """The scheme as plans and profiles name it: v only when above 1."""
    return (tp, pp, cp) if v == 1 else (tp, pp, cp, v)


def scheme_entries(profile: CostProfile) -> dict[Scheme, SchemeCost]:
    return {short_scheme(entry.tp, entry.pp, entry.cp, entry.v): entry for entry in profile.schemes}


def stage_time_s(profile: CostProfile, entry: SchemeCost, lengths: Sequence[int]) -> float:
    """DESIGN.md: `a * sum(l^2) + b * sum(l) + c`, in seconds, on one PP rank: an interleaved
    entry (v > 1) prices one of the rank's v chunks."""
    squares = sum(length * length for length in lengths)
    return entry.v * (entry.a * squares + entry.b * sum(lengths) + entry.c) * profile.seconds_per_unit


def in_flight_micro_batches(pp: int, v: int) -> int:
    """Micro-batches held at the peak of the fullest rank, counted over every rank: under 1F1B rank
    r holds `pp - r`; under interleaved 1F1B with groups of pp, rank r runs `2 (pp - r - 1) + (v - 1)
    pp` warm-up forwards (chunk micro-batches) and one more before its first backward frees one."""
    if v == 1:
        return max(pp - rank for rank in range(pp))
    return max(2 * (pp - rank - 1) + (v - 1) * pp + 1 for rank in range(pp))


def capacity_tokens(profile: CostProfile, entry: SchemeCost) -> int:
    """The profile's capacity, or the largest T with `k * (m1 T + (m2 + m3) T^2 + m4 T^2.5) <= free
    memory`, k the micro-batches in flight at the peak of the fullest rank unless given
    (`in_flight_micro_batches`)."""
    if entry.capacity_tokens is not None:
        return entry.capacity_tokens
    free = (profile.gpu_memory_bytes or 0.0) - profile.memory_reserve_bytes - (entry.static_bytes or 0.0)
    if free <= 0:
        return 0
    in_flight = entry.in_flight_micro_batches or in_flight_micro_batches(entry.pp, entry.v)
    per_token = in_flight * (entry.activation_bytes_per_token or 0.0)
    # sum(l^2) and max(l)^2 are both at most T^2, max(l)^2.5 at most T^2.5 (one sequence of T tokens)
    per_square = in_flight * (entry.activation_bytes_per_token_sq + entry.activation_bytes_per_longest_sq)
    per_power = in_flight * entry.activation_bytes_per_longest_pow
    if per_power > 0:  # no closed form: a binary search below per_power T^LONGEST_POWER <= free's root

        def fits(tokens: int) -> bool:
            return per_token * tokens + per_square * tokens**2 + per_power * tokens**LONGEST_POWER <= free

        low, high = 0, math.floor((free / per_power) ** (1 / LONGEST_POWER)) + 1  # fits(low); nothing above high fits
        while low < high:
            middle = (low + high + 1) // 2
            if fits(middle):
                low = middle
            else:
                high = middle - 1
        return low
    if per_square > 0:  # the positive root of per_square T^2 + per_token T - free = 0
        return math.floor((-per_token + math.sqrt(per_token**2 + 4 * per_square * free)) / (2 * per_square))
    if per_token > 0:
        return math.floor(free / per_token)
    return 2**62


def one_f_one_b_order(stage: int, num_stages: int, num_micro_batches: int) -> list[tuple[str, int]]:
    """The 1F1B operations of one stage (Narayanan et al. 2021): `pp - stage - 1` warm-up
    forwards (at most m), then one forward and one backward alternately, then the remaining
    backwards."""
    warmup = min(num_stages - stage - 1, num_micro_batches)
    order = [("F", index) for index in range(warmup)]
    for step in range(num_micro_batches - warmup):
        order += [("F", warmup + step), ("B", step)]
    order += [("B", index) for index in range(num_micro_batches - warmup, num_micro_batches)]
    return order


def pipeline_time_s(stage_times_s: Sequence[float], num_stages: int, fwd_fraction: float) -> float:
    """End of the last backward of a 1F1B pipeline whose micro-batch i takes `stage_times_s[i]`
    (forward share `fwd_fraction`) on every stage.

    By definition an operation ends at max(end of the operation before it on its stage, end of
    the operation it waits for) plus its duration, where a forward waits for the same forward on
    the stage before, a backward for the same backward on the stage after, and the last stage's
    backward for its own forward. The ends are evaluated in each stage's own order, sweeping the
    stages in turn: a stage goes on while the operation it is at finds what it waits for ended.
    """
    num_micro = len(stage_times_s)
    if num_micro == 0:
        return 0.0
    orders = [one_f_one_b_order(stage, num_stages, num_micro) for stage in range(num_stages)]
    duration = {"F": [fwd_fraction * t for t in stage_times_s], "B": [(1 - fwd_fraction) * t for t in stage_times_s]}
    end: dict[str, list[list[float | None]]] = {
        kind: [[None] * num_micro for _ in range(num_stages)] for kind in ("F", "B")
    }
    done = [0] * num_stages  # operations of each stage evaluated so far, in its order
    last_end = [0.0] * num_stages  # end of the operation a stage evaluated last
    remaining = 2 * num_micro * num_stages
    while remaining:
        before = remaining
        for stage, order in enumerate(orders):
            while done[stage] < len(order):
                kind, index = order[done[stage]]
                if kind == "F":
                    waited = end["F"][stage - 1][index] if stage > 0 else 0.0
                elif stage < num_stages - 1:
                    waited = end["B"][stage + 1][index]
                else:
                    waited = end["F"][stage][index]
                if waited is None:
                    break
                last_end[stage] = max(last_end[stage], waited) + duration[kind][index]
                end[kind][stage][index] = last_end[stage]
                done[stage] += 1
                remaining -= 1
        assert remaining < before, "the stages' 1F1B orders wait on each other"
    return end["B"][0][num_micro - 1]


def interleaved_rank_order(
    rank: int, num_stages: int, num_chunks: int, num_micro_batches: int, group: int
) -> list[tuple[str, int, int]]:
    """The operations of one rank under Megatron-Core's interleaved 1F1B as (kind "F" or "B",
    micro-batch, chunk), in its order (`interleaved_pipeline_time_s` gives the rules)."""
    full_groups = 0
    while (full_groups + 1) * group < num_micro_batches:  # groups that are not the last
        full_groups += 1
    last_size = num_micro_batches - full_groups * group

    def pair(k: int) -> tuple[int, int]:
        """(micro-batch, chunk) of table entry k."""
        if k < full_groups * group * num_chunks:
            which, within = divmod(k, group * num_chunks)
            return which * group + within % group, within // group
        within = k - full_groups * group * num_chunks
        return full_groups * group + within % last_size, within // last_size

    total = num_micro_batches * num_chunks
    warmup = min(total, 2 * (num_stages - rank - 1) + (num_chunks - 1) * group)
    order = [("F", *pair(k)) for k in range(warmup)]
    for k in range(total):
        if k + warmup < total:
            order.append(("F", *pair(k + warmup)))
        micro, chunk = pair(k)
        order.append(("B", micro, num_chunks - 1 - chunk))
    return order


def interleaved_pipeline_time_s(
    stage_times_s: Sequence[float], num_stages: int, num_chunks: int, fwd_fraction: float, group: int
) -> float:
    """End of the last operation of a pipeline running Megatron-Core's interleaved 1F1B: rank r
    holds chunks c = 0..v-1, virtual stage `c * pp + r`; micro-batch i takes `fwd_fraction *
    t_i / v` forward and the rest of `t_i / v` backward on each chunk.

    The k-th forward of every rank is pair k of the schedule table: micro-batches in groups of
    `group` (the last group is whatever remains, when at most `group`), each group walked chunk by
    chunk. Rank r first runs `2 (pp - r - 1) + (v - 1) group` forwards (at most all of them), then
    a forward and a backward in turn, then what backwards remain; its k-th backward is pair k with
    the chunk mirrored. A forward waits for the forward of its micro-batch on the virtual stage
    before it, a backward for the backward on the virtual stage after it, and the last virtual
    stage's backward for its own forward. Ends are evaluated by that recursion, memoised.
    """
    num_micro = len(stage_times_s)
    if num_micro == 0:
        return 0.0
    orders = [interleaved_rank_order(rank, num_stages, num_chunks, num_micro, group) for rank in range(num_stages)]
    before_on_rank = {}
    for rank, order in enumerate(orders):
        for place, (kind, micro, chunk) in enumerate(order):
            key = (kind, chunk * num_stages + rank, micro)
            before_on_rank[key] = (
                None
                if place == 0
                else (order[place - 1][0], order[place - 1][2] * num_stages + rank, order[place - 1][1])
            )
    last_virtual = num_chunks * num_stages - 1

    def waits_for(kind: str, virtual: int, micro: int) -> tuple[str, int, int] | None:
        if kind == "F":
            return ("F", virtual - 1, micro) if virtual > 0 else None
        return ("B", virtual + 1, micro) if virtual < last_virtual else ("F", virtual, micro)

    length = {"F": fwd_fraction, "B": 1.0 - fwd_fraction}
    end: dict[tuple[str, int, int], float] = {}
    for start in before_on_rank:
        stack = [start]
        while stack:
            op = stack[-1]
            if op in end:
                stack.pop()
                continue
            needed = [other for other in (before_on_rank[op], waits_for(*op)) if other is not None]
            missing = [other for other in needed if other not in end]
            if missing:
                stack.extend(missing)
                continue
            kind, _, micro = op
            end[op] = (
                max((end[other] for other in needed), default=0.0) + length[kind] * stage_times_s[micro] / num_chunks
            )
            stack.pop()
    return max(end.values())


def grad_sync_s(profile: CostProfile, pipeline_schemes: Sequence[Scheme]) -> float:
    """The profile's fixed time, or a ring all-reduce (Patarasuk & Yuan 2009) of the largest
    gradient shard among one replica per CP rank of every pipeline: `2 (n-1)/n * bytes / bw`."""
    if profile.grad_sync_s is not None:
        return profile.grad_sync_s * profile.seconds_per_unit
    replicas = sum(scheme[2] for scheme in pipeline_schemes)
    bandwidth = profile.grad_sync_bandwidth_bytes_per_s
    if bandwidth is None or replicas <= 1:
        return 0.0
    entries = scheme_entries(profile)
    largest = max(_sync_seconds_per_ring_factor(profile, entries[short_scheme(*scheme)]) for scheme in pipeline_schemes)
    return 2 * (replicas - 1) / replicas * largest * profile.grad_sync_exposed_fraction


def _sync_seconds_per_ring_factor(profile: CostProfile, entry: SchemeCost) -> float:
    """One scheme's sync bytes over its own bus bandwidth (each falling back to the profile's)."""
    sync_bytes = entry.grad_bytes_per_gpu if entry.grad_sync_bytes_per_gpu is None else entry.grad_sync_bytes_per_gpu
    bandwidth = entry.grad_sync_bandwidth_bytes_per_s or profile.grad_sync_bandwidth_bytes_per_s
    return sync_bytes / bandwidth


def parse_strategy_text(text: str) -> list[tuple[Scheme, int]]:
    """`2x<4,1,1> + 1x<8,2,1,2>` as [((4,1,1), 2), ((8,2,1,2), 1)]; ValueError when malformed."""
    terms = []
    for term in text.split("+"):
        count, separator, scheme = term.strip().partition("x")
        degrees = scheme.strip().removeprefix("<").removesuffix(">").split(",")
        if not separator or not count.strip().isdigit() or len(degrees) not in (2, 3, 4):
            raise ValueError(f"strategy term {term.strip()!r} is not COUNTx<tp,pp,cp> or COUNTx<tp,pp,cp,v>")
        tp, pp, cp, v = (int(degree) for degree in [*degrees, "1", "1"][:4])
        terms.append((short_scheme(tp, pp, cp, v), int(count)))
    return terms


def placement_order(scheme: Scheme) -> tuple[int, ...]:
    """The planner's placement order (DESIGN.md): larger TP*CP grids first, then larger
    pipelines, larger TP, fewer stages, smaller CP, fewer chunks."""
    tp, pp, cp, v = full_scheme(scheme)
    return (-tp * cp, -tp * pp * cp, -tp, pp, cp, v)


def canonical_strategy(schemes: Sequence[Scheme]) -> str:
    """The strategy text of pipelines with these schemes, in placement order."""
    counts: dict[Scheme, int] = {}
    for scheme in schemes:
        key = short_scheme(*scheme)
        counts[key] = counts.get(key, 0) + 1
    ordered = sorted(counts, key=placement_order)
    return " + ".join(f"{counts[s]}x<{','.join(map(str, s))}>" for s in ordered)


def placed_blocks(strategy_text: str) -> set[tuple[Scheme, tuple[int, ...]]]:
    """(scheme, ranks) of every pipeline of a strategy: contiguous rank blocks in placement order."""
    blocks = set()
    first_rank = 0
    terms = parse_strategy_text(strategy_text)
    for scheme, count in sorted(terms, key=lambda term: placement_order(term[0])):
        size = scheme[0] * scheme[1] * scheme[2]  # v does not change the GPUs
        for _ in range(count):
            blocks.add((scheme, tuple(range(first_rank, first_rank + size))))
            first_rank += size
    return blocks


def held_cells(scheme: Scheme, position: int, rows: int, columns: int) -> set[tuple[int, int]]:
    """The cells of a `rows x columns` grid over (layers x TP slices) that the GPU at `position` of a
    `scheme` pipeline holds: its stage's rows and its TP rank's columns (TP innermost, then CP, then
    PP inside a pipeline; rank `stage` holds virtual stages `stage + c pp` of `pp v`; `rows` a
    multiple of pp v, `columns` of tp)."""
    tp, pp, cp, v = full_scheme(scheme)
    stage, tp_rank = position // (tp * cp), position % tp
    rows_per_chunk, columns_per_slice = rows // (pp * v), columns // tp
    return {
        (row, column)
        for chunk in range(v)  # chunk c of stage s: virtual stage c * pp + s of pp * v
        for row in range((chunk * pp + stage) * rows_per_chunk, (chunk * pp + stage + 1) * rows_per_chunk)
        for column in range(tp_rank * columns_per_slice, (tp_rank + 1) * columns_per_slice)
    }


def switch_cost_s(
    profile: CostProfile, previous_strategy: str | None, pipelines: Sequence[tuple[Scheme, Sequence[int]]]
) -> float:
    """Re-sharding time from the previous strategy: every GPU loads the cells of its new shard that
    its old shard lacks (a fine grid over layers x TP slices; the share of missing cells times its
    new scheme's `grad_bytes_per_gpu` times `switch_bytes_per_weight_byte`), all GPUs in parallel
    over the slowest link, the GPU with the most to load setting the time; 0 without a previous
    strategy. A previous strategy with a profile that has no bandwidth cannot be priced: ValueError."""
    if previous_strategy is None:
        return 0.0
    bandwidth = profile.grad_sync_bandwidth_bytes_per_s
    if bandwidth is None:
        raise ValueError("the cost profile has no grad_sync_bandwidth_bytes_per_s to price a switch")
    old_place = {
        rank: (scheme, position)
        for scheme, ranks in placed_blocks(previous_strategy)
        for position, rank in enumerate(ranks)
    }
    entries = scheme_entries(profile)
    most = 0.0
    for scheme, ranks in pipelines:
        for position, rank in enumerate(ranks):
            missing = missing_share(scheme, position, *old_place[rank]) if rank in old_place else 1.0
            most = max(most, missing * entries[short_scheme(*scheme)].grad_bytes_per_gpu)
    return most * profile.switch_bytes_per_weight_byte / bandwidth


@cache
def missing_share(scheme: Scheme, position: int, old_scheme: Scheme, old_position: int) -> float:
    """The share of the new shard's grid cells the old shard does not hold (memoised: a placement
    repeats the same pairs of positions over its pipelines)."""
    scheme, old_scheme = full_scheme(scheme), full_scheme(old_scheme)
    rows = math.lcm(scheme[1] * scheme[3], old_scheme[1] * old_scheme[3])
    columns = math.lcm(scheme[0], old_scheme[0])
    new = held_cells(scheme, position, rows, columns)
    old = held_cells(old_scheme, old_position, rows, columns)
    return len(new - old) / len(new)
