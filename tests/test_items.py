"""Oversize policies: error, split, drop."""

from __future__ import annotations

import pytest

from hydraplan.planner.errors import PlanningError
from hydraplan.planner.items import prepare_items
from hydraplan.planner.schemas import OversizePolicy


def test_fitting_batch_is_passed_through():
    items = prepare_items([5, 3, 9], 10, OversizePolicy.ERROR)
    assert items.lengths.tolist() == [5, 3, 9] and items.sequence_ids.tolist() == [0, 1, 2]
    assert items.offsets.tolist() == [0, 0, 0] and not items.dropped_sequence_ids


def test_error_policy_names_count_longest_and_capacity():
    with pytest.raises(PlanningError, match=r"2 sequence\(s\) exceed .* 10 tokens \(longest: id 2, 30 tokens\)"):
        prepare_items([5, 12, 30], 10, OversizePolicy.ERROR)


def test_split_policy_cuts_capacity_sized_chunks():
    items = prepare_items([5, 25], 10, OversizePolicy.SPLIT)
    assert items.sequence_ids.tolist() == [0, 1, 1, 1]
    assert items.offsets.tolist() == [0, 0, 10, 20]
    assert items.lengths.tolist() == [5, 10, 10, 5]
    assert items.split_sequence_ids == (1,)


def test_drop_policy_lists_dropped_ids_and_refuses_an_empty_result():
    items = prepare_items([5, 25, 7], 10, OversizePolicy.DROP)
    assert items.sequence_ids.tolist() == [0, 2] and items.dropped_sequence_ids == (1,)
    with pytest.raises(PlanningError, match="nothing left"):
        prepare_items([25], 10, OversizePolicy.DROP)
