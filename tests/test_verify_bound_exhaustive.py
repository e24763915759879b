"""The bound verifier against the whole exhaustive suite (`tests/test_exhaustive.py`'s 50 random
tiny instances): the verified bound is at most the brute-forced optimum on every one, and a claim
raised just above the optimum fails. The first instances run in `tests/test_verify_bound.py`."""

from __future__ import annotations

import pytest
from test_exhaustive import NUM_CASES
from test_verify_bound import QUICK_CASES, assert_verified_at_most_optimum


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(QUICK_CASES), NUM_CASES))
def test_verified_bound_against_the_whole_exhaustive_suite(case: int) -> None:
    assert_verified_at_most_optimum(case)
