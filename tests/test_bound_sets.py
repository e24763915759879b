"""The set bounds and their sync floors against references written here: every set of schemes by
itertools (its area and longest-item bound from the tables), and the fewest weight replicas and
largest gradient shard of a set worked out by hand from the schemes' degrees. The schemes are
chosen so that each piece decides somewhere: fewer distinct lengths than schemes, a set whose
context-parallel degrees bind the replicas, divisions that come out exact, equal shards, and a
set whose widest scheme is its first."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hydraplan.planner.bounds import BoundTables, SyncFloors
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile, SchemeCost

NUM_GPUS = 8
BANDWIDTH = 1e11
# (tp, pp, cp, gradient bytes per GPU); GPUs per weight replica = tp pp
DEGREES = [
    (1, 1, 1, 16e9),  # 0: 1 GPU per replica, the largest shard
    (2, 1, 1, 8e9),  # 1: 2 GPUs per replica
    (1, 1, 2, 12e9),  # 2: 1 GPU per replica, two replicas per pipeline, a shard between 0's and 1's
    (2, 2, 2, 4e9),  # 3: 4 GPUs per replica, two replicas per pipeline
    (4, 1, 1, 2e9),  # 4: 4 GPUs per replica, the smallest shard
]
PROFILE = CostProfile(
    source="user",
    model="pin",
    gpu="pin",
    num_layers=4,
    schemes=[
        SchemeCost(
            tp=tp,
            pp=pp,
            cp=cp,
            a=1e-9 / (tp * cp),
            b=1e-4 / (tp * cp),
            c=0.01 * (1 + index),
            capacity_tokens=2_000 * tp * cp,
            grad_bytes_per_gpu=shard,
        )  # fmt: skip
        for index, (tp, pp, cp, shard) in enumerate(DEGREES)
    ],
    grad_sync_bandwidth_bytes_per_s=BANDWIDTH,
)
COST = ProfileCostModel(PROFILE)
COEFS = [COST.coefficients(scheme) for scheme in COST.schemes()]


def test_the_schemes_are_in_the_order_written():
    assert [(c.scheme.tp, c.scheme.pp, c.scheme.cp, c.sync_bytes) for c in COEFS] == DEGREES


def fewest_replicas(columns) -> int:
    """Each pipeline of scheme s holds cp_s weight replicas: one pipeline of each of `columns` holds
    their sum; and N GPUs hold at least N / (GPUs per replica of the widest replica) replicas."""
    return max(
        sum(DEGREES[c][2] for c in columns), math.ceil(NUM_GPUS / max(DEGREES[c][0] * DEGREES[c][1] for c in columns))
    )


def floor_by_hand(columns) -> float:
    """A ring all-reduce over r replicas moves 2 (r - 1) / r of the largest shard of the set."""
    replicas = fewest_replicas(columns)
    shard = max(DEGREES[c][3] for c in columns)
    return 0.0 if replicas <= 1 else 2 * (replicas - 1) / replicas * shard / BANDWIDTH


def test_fewest_replicas_by_hand():
    # the hand values, from the degrees: N / GPUs-per-replica where that binds, the cp sum where it does
    assert [fewest_replicas((c,)) for c in range(5)] == [8, 4, 8, 2, 2]
    assert fewest_replicas((1, 3)) == 3  # cp 1 + 2 binds over 8 / 4 = 2
    assert fewest_replicas((3, 4)) == 3
    assert fewest_replicas((0, 4)) == 2


SETS = [(c,) for c in range(5)] + list(itertools.combinations(range(5), 2)) + list(itertools.combinations(range(5), 3))


def test_sync_floors_of_single_sets_by_hand():
    floors = SyncFloors(COST, COEFS, NUM_GPUS)
    for columns in SETS:
        assert floors(columns) == pytest.approx(floor_by_hand(columns), rel=1e-12), columns
        assert floors.fewest_replicas(columns) == fewest_replicas(columns), columns
    assert floors.widest((2, 0)) == 0 and floors.widest((3, 1)) == 1 and floors.widest((4, 2, 3)) == 2


def test_the_least_floor_is_the_fewest_replicas_of_the_widest_replica_at_the_narrowest_shard():
    floors = SyncFloors(COST, COEFS, NUM_GPUS)
    # 8 GPUs / 4 GPUs per replica = 2 replicas; the smallest shard is scheme 4's 2e9 bytes
    assert floors.least() == pytest.approx(2 * (2 - 1) / 2 * 2e9 / BANDWIDTH, rel=1e-12)
    assert floors.least() <= min(floor_by_hand(columns) for columns in SETS)


@pytest.mark.parametrize("prefix", [(), (0,), (1,), (3,), (0, 4), (1, 3)])
def test_sync_floors_of_extended_sets_by_hand(prefix):
    floors = SyncFloors(COST, COEFS, NUM_GPUS)
    children = np.array([c for c in range(5) if c not in prefix])
    expected = [floor_by_hand((*prefix, int(child))) for child in children]
    assert floors.extended(prefix, children).tolist() == pytest.approx(expected, rel=1e-12)


def test_sync_floors_of_many_blocks_by_hand():
    floors = SyncFloors(COST, COEFS, NUM_GPUS)
    # the empty prefix (its child is the widest), a prefix whose widest is column 0 (and a child
    # whose shard lies between column 0's and column 1's), one whose widest is a later column, and a
    # two-scheme prefix whose cp sum binds
    prefixes = [(), (0,), (1,), (3,), (1, 3), (2,)]
    block_of, children = [], []
    for block, prefix in enumerate(prefixes):
        for child in range(5):
            if child not in prefix:
                block_of.append(block)
                children.append(child)
    expected = [floor_by_hand((*prefixes[b], c)) for b, c in zip(block_of, children)]
    got = floors.extended_blocks(prefixes, np.array(block_of), np.array(children))
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert len(set(np.round(expected, 12))) >= 5  # the floors differ: a mix-up of sets would show


def set_bound_by_hand(tables: BoundTables, columns, num_gpus: int) -> float:
    """Every item at its cheapest GPU-seconds over the set, shared by the GPUs; or the longest
    item's least pipeline time over the set."""
    cheapest = tables.gpu_seconds[:, list(columns)].min(axis=1)
    longest = tables.longest_s[:, list(columns)].min(axis=1).max()
    return max(float(tables.multiplicity @ cheapest) / num_gpus, float(longest))


# two distinct lengths, fewer than the five schemes; 5,000 tokens fits only schemes 3 and 4; with
# 8 items of 1,500 tokens the area holds the bound of some sets, the longest item of others
LENGTHS = np.array([1_500] * 8 + [5_000])


@pytest.mark.parametrize("max_schemes", [1, 2, 3])
def test_all_set_bounds_are_those_of_every_set_of_schemes(max_schemes):
    tables = BoundTables.build(LENGTHS, COEFS)
    assert tables.gpu_seconds.shape == (2, 5)
    holds = {
        columns: float(tables.multiplicity @ tables.gpu_seconds[:, list(columns)].min(axis=1)) / NUM_GPUS
        > tables.longest_s[:, list(columns)].min(axis=1).max()
        for columns in [(3,), (0, 3), (0, 4)]
    }
    assert holds == {(3,): True, (0, 3): False, (0, 4): True}
    expected = {}
    for size in range(1, max_schemes + 1):
        for columns in itertools.combinations(range(5), size):
            bound = set_bound_by_hand(tables, columns, NUM_GPUS)
            if math.isfinite(bound):
                expected[columns] = bound
    got = list(tables.all_set_bounds(max_schemes, NUM_GPUS))
    assert [columns for columns, _ in got] == sorted(expected, key=lambda c: (c[:-1], c[-1]))
    assert dict(got) == pytest.approx(expected, rel=1e-12)
    # a cutoff keeps exactly the sets below it
    cutoff = float(np.median(list(expected.values())))
    below = dict(tables.all_set_bounds(max_schemes, NUM_GPUS, cutoff))
    assert below == pytest.approx({k: v for k, v in expected.items() if v < cutoff}, rel=1e-12)


def test_set_bound_blocks_come_by_prefix_in_lexicographic_order():
    tables = BoundTables.build(np.array([1_500, 3_000]), COEFS)  # 3,000 tokens fit every scheme but 0
    blocks = list(tables.set_bound_blocks(3, NUM_GPUS))
    prefixes = [prefix for prefix, _, _ in blocks]
    assert prefixes == [(), (0,), (0, 1), (0, 2), (0, 3), (1,), (1, 2), (1, 3), (2,), (2, 3), (3,)]
    for prefix, children, bounds in blocks:
        start = prefix[-1] + 1 if prefix else 0
        assert children.tolist() == [c for c in range(start, 5) if (*prefix, c) != (0,)]  # (0,) holds no 3,000
        assert bounds.tolist() == pytest.approx([set_bound_by_hand(tables, (*prefix, c), NUM_GPUS) for c in children])


@pytest.mark.parametrize("first_column", [1, 2, 4])
@pytest.mark.parametrize("max_schemes", [1, 2, 3])
def test_set_bound_blocks_from_a_first_column(max_schemes, first_column):
    tables = BoundTables.build(np.array([1_500, 3_000]), COEFS)
    blocks = list(tables.set_bound_blocks(max_schemes, NUM_GPUS, first_column=first_column))
    # the blocks of prefixes of 1 to max_schemes - 1 columns that start at first_column or later
    expected = [
        prefix
        for size in range(1, max_schemes)
        for prefix in itertools.combinations(range(first_column, 5), size)
        if prefix[-1] < 4
    ]
    assert [prefix for prefix, _, _ in blocks] == sorted(expected)
    for prefix, children, bounds in blocks:
        assert children.tolist() == list(range(prefix[-1] + 1, 5))
        assert bounds.tolist() == pytest.approx([set_bound_by_hand(tables, (*prefix, c), NUM_GPUS) for c in children])


def test_sets_of_one_two_and_three_schemes_in_one_call_get_their_own_bounds():
    # the replica split takes its sets as one padded array: a mix of sizes in one call must give
    # each set the bound it has alone
    tables = BoundTables.build(np.array([1_500] * 8 + [3_000]), COEFS)
    floors = SyncFloors(COST, COEFS, NUM_GPUS)
    sets = [(3,), (1, 4), (2, 3, 4), (4,), (0, 1, 2)]
    together = tables.replica_split_bounds_s(sets, NUM_GPUS, floors)
    alone = [tables.replica_split_bounds_s([columns], NUM_GPUS, floors)[0] for columns in sets]
    assert together.tolist() == pytest.approx(alone, rel=1e-12)
    assert len(set(np.round(alone, 12))) == len(sets)
