"""Questions answered from a sweep's measured rows, each saying which configuration and why.

- `smallest_clusters(rows, X)`: per GPU type (and model, dataset, ... where those vary), the fewest
  GPUs whose rows reach X tokens/s (ties: the faster, then the cheaper per hour).
- `fastest_within(rows, Y)`: the highest tokens/s among the rows costing at most Y per hour.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydraplan.api.whatif.schemas import Frozen, RowStatus, WhatifRow


class Answer(Frozen):
    """One answer: the question, the chosen row (None when no row qualifies) and the reason."""

    question: str
    gpu: str | None = None
    row_index: int | None = None
    text: str


def describe(row: WhatifRow) -> str:
    """A configuration in words: `64 x h100-sxm-80gb (8/node), llama3-8b, wikipedia, cap 32768, ...`."""
    cap = "no cap" if row.context_cap is None else f"cap {row.context_cap}"
    tokens = "" if row.tokens_per_step is None else f", {row.tokens_per_step:,} tokens/step"
    return (
        f"row {row.index}: {row.num_gpus} x {row.gpu} ({row.gpus_per_node}/node), {row.model}, {row.dataset}, "
        f"{cap}{tokens}, {row.cost_source}, {row.planner}"
    )


def _ok(rows: Sequence[WhatifRow]) -> list[WhatifRow]:
    return [row for row in rows if row.status == RowStatus.OK and row.tokens_per_s is not None]


# everything that sets a row apart but the cluster size: a target is answered per such setting
SETTING_FIELDS = ("gpu", "model", "dataset", "context_cap", "tokens_per_step", "cost_source", "planner")


def _setting(row: WhatifRow) -> tuple:
    return tuple(getattr(row, field) for field in SETTING_FIELDS)


def _setting_label(row: WhatifRow, shown: Sequence[str]) -> str:
    parts = [str(row.gpu)] + [f"{field} {getattr(row, field)}" for field in shown if field != "gpu"]
    return ", ".join(parts)


def smallest_clusters(rows: Sequence[WhatifRow], target_tokens_per_s: float) -> list[Answer]:
    """Per GPU type (and per model, dataset, cap, ... where those vary too), the smallest cluster
    reaching the target throughput; in the rows' order."""
    question = f"smallest cluster reaching {target_tokens_per_s:,.0f} tokens/s"
    shown = [field for field in SETTING_FIELDS if len({getattr(row, field) for row in rows}) > 1]
    answers = []
    for setting in dict.fromkeys(_setting(row) for row in rows):
        group = [row for row in rows if _setting(row) == setting]
        label = _setting_label(group[0], shown)
        answers.append(_smallest(question, label, group, target_tokens_per_s))
    return answers


def _smallest(question: str, label: str, group: Sequence[WhatifRow], target_tokens_per_s: float) -> Answer:
    gpu = group[0].gpu
    candidates = _ok(group)
    reaching = [row for row in candidates if row.tokens_per_s >= target_tokens_per_s]  # type: ignore[operator]
    if not reaching:
        text = f"{label}: no configuration reaches {target_tokens_per_s:,.0f} tokens/s"
        if candidates:
            best = max(candidates, key=lambda row: row.tokens_per_s or 0.0)
            text += f"; the fastest, {describe(best)}, gives {best.tokens_per_s:,.0f} tokens/s"
        failed = sum(1 for row in group if row.status == RowStatus.FAILED)
        if failed:
            text += f" ({failed} configuration(s) could not be planned)"
        return Answer(question=question, gpu=gpu, text=text)
    chosen = min(reaching, key=lambda row: (row.num_gpus, -(row.tokens_per_s or 0.0), row.cost_per_hour or 0.0))
    smaller = [row for row in candidates if row.num_gpus < chosen.num_gpus]
    why = f"{chosen.tokens_per_s:,.0f} tokens/s >= {target_tokens_per_s:,.0f}"
    if smaller:
        best_small = max(smaller, key=lambda row: row.tokens_per_s or 0.0)
        sizes = ", ".join(str(size) for size in sorted({row.num_gpus for row in smaller}))
        why += f"; no smaller cluster ({sizes} GPUs) does: the best reaches {best_small.tokens_per_s:,.0f} tokens/s "
        why += f"({describe(best_small)})"
    else:
        why += "; it is the smallest cluster swept"
    return Answer(question=question, gpu=gpu, row_index=chosen.index, text=f"{label}: {describe(chosen)}: {why}")


def fastest_within(rows: Sequence[WhatifRow], budget_per_hour: float) -> Answer:
    """The fastest configuration whose cost per hour is within the budget."""
    question = f"fastest configuration within {budget_per_hour:,.2f} per hour"
    priced = [row for row in _ok(rows) if row.cost_per_hour is not None]
    within = [row for row in priced if row.cost_per_hour <= budget_per_hour]  # type: ignore[operator]
    if not within:
        cheapest = min(priced, key=lambda row: row.cost_per_hour or 0.0, default=None)
        text = f"no configuration costs at most {budget_per_hour:,.2f} per hour"
        if cheapest is not None:
            text += f"; the cheapest, {describe(cheapest)}, costs {cheapest.cost_per_hour:,.2f} per hour"
        return Answer(question=question, text=text)
    ranked = sorted(within, key=lambda row: (-(row.tokens_per_s or 0.0), row.cost_per_hour or 0.0, row.index))
    chosen = ranked[0]
    why = (
        f"{chosen.tokens_per_s:,.0f} tokens/s at {chosen.cost_per_hour:,.2f} per hour "
        f"({chosen.cost_per_1m_tokens:.4g} per 1M tokens), the fastest of {len(within)} configuration(s) "
        f"within {budget_per_hour:,.2f} per hour"
    )
    if len(ranked) > 1:
        runner_up = ranked[1]
        why += f"; the next, {describe(runner_up)}, gives {runner_up.tokens_per_s:,.0f} tokens/s"
    over = [row for row in priced if row not in within and (row.tokens_per_s or 0.0) > (chosen.tokens_per_s or 0.0)]
    if over:
        why += f"; {len(over)} faster configuration(s) cost more"
    return Answer(question=question, gpu=chosen.gpu, row_index=chosen.index, text=f"{describe(chosen)}: {why}")
