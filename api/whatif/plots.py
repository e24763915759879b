"""The sweep's figures (matplotlib, Agg backend), each written as PNG and SVG.

- throughput: tokens/s against GPU count, one line per GPU type (and model, dataset, cap, planner
  when those vary);
- cost: cost per 1M tokens against GPU count (only when prices were given);
- speedup: speedup over each baseline against the context cap;
- mix: the strategy mix (share of GPUs per scheme) of every configuration, stacked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from hydraplan.api.whatif.schemas import RowStatus, WhatifRow

FORMATS = ("png", "svg")
NO_CAP_LABEL = "none"
MATPLOTLIB_MISSING = "plots need matplotlib: pip install 'hydraplan[whatif]'"


def _varying(rows: Sequence[WhatifRow], fields: Sequence[str]) -> list[str]:
    return [field for field in fields if len({getattr(row, field) for row in rows}) > 1]


def _series(rows: Sequence[WhatifRow], fields: Sequence[str]) -> dict[str, list[WhatifRow]]:
    """Rows grouped by the values of `fields` that vary, in the rows' order."""
    shown = _varying(rows, fields)
    groups: dict[str, list[WhatifRow]] = {}
    for row in rows:
        label = ", ".join(_shown(field, getattr(row, field)) for field in shown) or (row.gpu or "all")
        groups.setdefault(label, []).append(row)
    return groups


def _shown(field: str, value: object) -> str:
    if field == "num_gpus":
        return f"{value} GPUs"
    if field == "gpus_per_node":
        return f"{value}/node"
    if field == "context_cap":
        return f"cap {NO_CAP_LABEL if value is None else value}"
    if field == "tokens_per_step":
        return f"{value} tokens/step"
    return str(value)


SERIES_FIELDS = ("gpu", "model", "gpus_per_node", "dataset", "context_cap", "tokens_per_step", "cost_source", "planner")


def write_plots(folder: Path, rows: Sequence[WhatifRow]) -> list[Path]:
    """Every figure the rows allow, as PNG and SVG in `folder`; returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError(MATPLOTLIB_MISSING) from None
    folder.mkdir(parents=True, exist_ok=True)
    ok = [row for row in rows if row.status == RowStatus.OK]
    figures: list[tuple[str, Callable]] = [("throughput", _throughput), ("mix", _mix)]
    if any(row.cost_per_1m_tokens is not None for row in ok):
        figures.append(("cost", _cost))
    if any(row.speedups for row in ok):
        figures.append(("speedup", _speedup))
    written = []
    for name, draw in figures:
        panels = sorted({baseline for row in ok for baseline in row.speedups}) if name == "speedup" else [None]
        figure, grid = plt.subplots(
            1, len(panels), figsize=(max(8, 4.5 * len(panels)), 4.8), layout="constrained", sharey=True, squeeze=False
        )
        for axes, panel in zip(grid[0], panels):
            draw(axes, ok) if panel is None else draw(axes, ok, panel)
        for extension in FORMATS:
            path = folder / f"{name}.{extension}"
            figure.savefig(path, dpi=110)
            written.append(path)
        plt.close(figure)
    return written


def _line_plot(axes, rows: Sequence[WhatifRow], value: Callable[[WhatifRow], float | None], fields) -> None:
    if not rows:
        return
    for label, group in _series(rows, fields).items():
        points = sorted((row.num_gpus, value(row)) for row in group if value(row) is not None)
        if points:
            axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    counts = sorted({row.num_gpus for row in rows})
    axes.set_xscale("log", base=2)
    axes.set_xticks(counts, [str(count) for count in counts])
    axes.minorticks_off()
    axes.set_xlabel("GPUs")
    axes.grid(True, alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")


def _throughput(axes, rows: Sequence[WhatifRow]) -> None:
    _line_plot(axes, rows, lambda row: row.tokens_per_s, SERIES_FIELDS)
    axes.set_ylabel("tokens/s")
    axes.set_title("Throughput vs GPU count")


def _cost(axes, rows: Sequence[WhatifRow]) -> None:
    _line_plot(axes, rows, lambda row: row.cost_per_1m_tokens, SERIES_FIELDS)
    axes.set_ylabel("cost per 1M tokens")
    axes.set_title("Cost per 1M tokens vs GPU count")


def _speedup(axes, rows: Sequence[WhatifRow], baseline: str) -> None:
    caps = sorted({row.context_cap for row in rows}, key=lambda cap: (cap is None, cap or 0))
    positions = {cap: index for index, cap in enumerate(caps)}
    fields = [field for field in SERIES_FIELDS if field != "context_cap"] + ["num_gpus"]
    for label, group in _series(rows, fields).items():
        points = sorted(
            (positions[row.context_cap], row.speedups[baseline]) for row in group if baseline in row.speedups
        )
        if points:
            axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xticks(range(len(caps)), [NO_CAP_LABEL if cap is None else f"{cap:,}" for cap in caps])
    axes.set_xlabel("context cap (tokens)")
    axes.set_ylabel("speedup (baseline step time / hydraplan's)")
    axes.set_title(f"Speedup over {baseline} vs context cap")
    axes.grid(True, alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="x-small")


def _mix(axes, rows: Sequence[WhatifRow]) -> None:
    schemes = sorted({scheme for row in rows for scheme in row.strategy_mix})
    labels = [f"#{row.index}" for row in rows]
    bottoms = [0.0] * len(rows)
    for scheme in schemes:
        shares = [row.strategy_mix.get(scheme, 0.0) for row in rows]
        axes.bar(labels, shares, bottom=bottoms, label=scheme)
        bottoms = [bottom + share for bottom, share in zip(bottoms, shares)]
    axes.set_ylabel("share of GPUs")
    axes.set_xlabel("configuration (row index)")
    axes.set_title("Strategy mix per configuration")
    axes.tick_params(axis="x", labelrotation=90, labelsize="x-small")
    if schemes:
        axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0), title="scheme")
