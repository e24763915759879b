"""The whole-step check's critical path (benchmarks/pipeline_step.py) agrees with the planner's
1F1B simulation when every stage takes the planner's times."""

from __future__ import annotations

import pytest

from tests.runtime_support import require_torch

require_torch()

from benchmarks.pipeline_step import critical_path_s  # noqa: E402
from hydraplan.planner.simulate import simulate_1f1b  # noqa: E402

pytestmark = pytest.mark.runtime


@pytest.mark.parametrize("stage_times", [[3.0, 3.0, 3.0, 3.0], [1.0, 6.0, 2.5, 0.5, 4.0]])
def test_critical_path_equals_the_planner_simulation(stage_times: list[float]) -> None:
    fwd_fraction = 1 / 3
    per_stage = {f"F{i}": fwd_fraction * t for i, t in enumerate(stage_times)}
    per_stage |= {f"B{i}": (1 - fwd_fraction) * t for i, t in enumerate(stage_times)}
    path = critical_path_s([per_stage, per_stage], len(stage_times), [0.0] * len(stage_times))
    assert path == pytest.approx(simulate_1f1b(stage_times, 2, fwd_fraction))


def test_transfers_delay_the_dependent_operations() -> None:
    per_stage = {"F0": 1.0, "B0": 2.0}
    assert critical_path_s([per_stage, per_stage], 1, [0.5]) == pytest.approx(1 + 0.5 + 1 + 2 + 0.5 + 2)
