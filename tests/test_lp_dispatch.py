"""LP dispatch (`planner.lp_dispatch`): the type LP and the rounding of its shares, built and
rounded as arrays, keep the per-length rules they had as loops."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import synthetic_profile, wikipedia_like_batch

from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.lp_dispatch import lp_dispatch, round_shares, solve_type_lp


def rounded_one_length_at_a_time(lengths: np.ndarray, unique: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """The rule, one length at a time: shares scaled to the length's items, floors, then one more
    for each of the largest remainders (the first type first on a tie)."""
    item_type = np.empty(len(lengths), dtype=np.int64)
    for row, length in enumerate(unique.tolist()):
        members = np.flatnonzero(lengths == length)
        want = shares[row] * (len(members) / max(shares[row].sum(), 1e-12))
        whole = np.floor(want + 1e-9).astype(np.int64)
        for kind in np.argsort(-(want - whole), kind="stable")[: len(members) - int(whole.sum())].tolist():
            whole[kind] += 1
        item_type[members] = np.repeat(np.arange(len(whole)), whole)
    return item_type


@pytest.mark.parametrize("trial", range(20))
def test_round_shares_splits_each_length_by_largest_remainder(trial: int) -> None:
    rng = np.random.default_rng(trial)
    num_types = int(rng.integers(1, 5))
    lengths = rng.integers(1, 40, int(rng.integers(1, 300)))
    unique = np.unique(lengths)
    sizes = np.array([(lengths == length).sum() for length in unique])
    shares = rng.random((len(unique), num_types))
    shares[rng.random(shares.shape) < 0.3] = 0.0
    if trial % 2:
        shares = np.round(shares * 4) / 4  # quarters: remainders tie
    shares[:, 0] += 0.25  # every length has some share
    shares = shares / shares.sum(axis=1, keepdims=True) * sizes[:, None]  # as the LP's rows sum
    types = round_shares(lengths, unique, shares)
    assert types.tolist() == rounded_one_length_at_a_time(lengths, unique, shares).tolist()
    for row, length in enumerate(unique.tolist()):  # within one item of each share
        counts = np.bincount(types[lengths == length], minlength=num_types)
        assert (np.abs(counts - shares[row]) < 1 + 1e-9).all()


def test_the_type_lp_places_every_item_and_the_dispatch_every_item_once() -> None:
    cost = ProfileCostModel(synthetic_profile(max_gpus=32))
    lengths = np.asarray(wikipedia_like_batch(200_000, seed=4), dtype=np.int64)
    schemes = sorted(cost.schemes(), key=lambda scheme: (scheme.num_gpus, scheme))
    types = [cost.coefficients(scheme) for scheme in schemes[:3]]
    fits = [coef for coef in types if coef.capacity_tokens >= lengths.max()]
    assert fits, "the test needs a type that holds the longest item"
    solved = solve_type_lp(lengths, types, [2, 1, 1], [1.0, 1.1, 1.2])
    assert solved is not None
    unique, shares, step_s = solved
    _, multiplicity = np.unique(lengths, return_counts=True)
    assert np.allclose(shares.sum(axis=1), multiplicity, atol=1e-6) and step_s > 0
    for kind, coef in enumerate(types):  # no share where a type cannot hold the length
        assert (shares[unique > coef.capacity_tokens, kind] == 0).all()
    coefs = [types[0], types[0], types[1], types[2]]
    assignment = lp_dispatch(lengths, coefs)
    assert assignment is not None
    placed = np.sort(np.concatenate(assignment))
    assert placed.tolist() == list(range(len(lengths)))
    for items, coef in zip(assignment, coefs):
        assert len(items) >= 1 and lengths[items].max() <= coef.capacity_tokens
