"""Small what-if sweeps whose plans do not depend on the wall clock.

Every step is a handful of sequences (tiny model, lognormal data cut at 4K, ~6K tokens) with a
30 s budget that is never reached: the search ends on its own (optimal or its work limit), so the
same configuration gives the same row in any process or executor.
"""

from __future__ import annotations

from typing import Any

from hydraplan.api.whatif.schemas import Configuration, WhatifRow
from hydraplan.api.whatif.spec import build_spec, expand

TINY_AXES: dict[str, Any] = {
    "models": ["tiny"],
    "gpus": ["h100-sxm-80gb"],
    "num_gpus": [8, 16],
    "datasets": ["lognormal"],
    "tokens_per_step": [6000],
    "context_caps": [4096],
    "seeds": 2,
    "time_limit_s": 30.0,
    "compare": ["megatron", "wlb"],
}
TINY_FLAGS = [
    "--model", "tiny", "--gpu", "h100-sxm-80gb", "--num-gpus", "8,16", "--dataset", "lognormal",
    "--tokens-per-step", "6000", "--context-cap", "4096", "--seeds", "2", "--time-limit-s", "30",
    "--compare", "megatron,wlb",
]  # fmt: skip


def tiny_configurations(**overrides: Any) -> list[Configuration]:
    spec, where = build_spec({}, {**TINY_AXES, **overrides}, None)
    return expand(spec, where, 100, False)


def comparable(rows: list[WhatifRow]) -> list[dict[str, Any]]:
    """Rows as dicts in sweep order (everything in a row is deterministic: no solve times)."""
    return [row.model_dump(mode="json") for row in sorted(rows, key=lambda row: row.index)]


class InterruptAfter:
    """An executor that runs tasks in process and raises KeyboardInterrupt after `count` rows,
    as Ctrl-C in the middle of a sweep does; it records the tasks it was given."""

    name = "interrupt-after"

    def __init__(self, count: int | None) -> None:
        self.count = count
        self.given: list[int] = []

    def run(self, tasks, on_row) -> None:
        from hydraplan.api.whatif.engine import evaluate_row

        self.given = [index for index, _ in tasks]
        for done, (index, configuration) in enumerate(tasks):
            if self.count is not None and done == self.count:
                raise KeyboardInterrupt
            on_row(evaluate_row(index, configuration))
