"""PNG drawing of a `TimelineDocument` with matplotlib (the optional `plots` extra).

The picture follows the SVG's layout (`api.render.svg`): one axes per plan on a shared time
axis, a row per stage, forward blocks light, backward dark, the gradient sync hatched, the lower
bound dashed. The document itself is stored in the PNG as a text chunk, `hydraplan-timeline`, so
the image carries its exact numbers like the SVG's data attributes do.
"""

from __future__ import annotations

import json
from pathlib import Path

from hydraplan.api.render.svg import BACKWARD, BOUND, FORWARD, IDLE, SYNC, group_label, ms, plan_heading
from hydraplan.api.render.timeline import PlanTimeline, TimelineDocument

PNG_TEXT_KEY = "hydraplan-timeline"
MATPLOTLIB_MISSING = "a PNG timeline needs matplotlib: pip install 'hydraplan[plots]' (or write .svg or .html)"
DPI = 110
MIN_BAR_SHARE = 0.003  # narrowest histogram bar, as a share of the step time


def write_png(document: TimelineDocument, path: str | Path) -> None:
    """Draw `document` into the PNG file `path`; `ValueError` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        from matplotlib import pyplot
    except ImportError:
        raise ValueError(MATPLOTLIB_MISSING) from None
    heights = [_rows(timeline) + 2.5 for timeline in document.plans]
    figure, axes_list = pyplot.subplots(
        len(document.plans),
        1,
        sharex=True,
        squeeze=False,
        figsize=(12, max(2.5, 0.2 * sum(heights))),
        gridspec_kw={"height_ratios": heights},
    )
    try:
        for axes, timeline in zip(axes_list[:, 0], document.plans):
            _draw_plan(axes, timeline)
        last = axes_list[-1, 0]
        last.set_xlim(0, document.time_max_s * 1e3 * 1.01)
        last.set_xlabel("time (ms)")
        figure.tight_layout()
        data = json.dumps(document.model_dump(mode="json"), separators=(",", ":"))
        figure.savefig(path, format="png", dpi=DPI, metadata={PNG_TEXT_KEY: data})
    finally:
        pyplot.close(figure)


def _rows(timeline: PlanTimeline) -> int:
    """Stage rows of the drawn groups, plus one for a histogram."""
    return sum(group.num_stages for group in timeline.groups) + (2 if timeline.histogram else 0)


def _draw_plan(axes, timeline: PlanTimeline) -> None:
    """One plan on `axes`: y is the row (0 at the top), x milliseconds."""
    title, facts = plan_heading(timeline)
    axes.set_title(f"{title}\n{facts}", loc="left", fontsize=9)
    row, ticks, labels = 0, [], []
    for group in timeline.groups:
        slowest = group.pipelines[0] == timeline.slowest_pipeline
        for stage in range(group.num_stages):
            axes.broken_barh([(0, group.time_s * 1e3)], (row + stage, 0.9), facecolors=IDLE)
            ticks.append(row + stage + 0.45)
            labels.append((group_label(group) + (" slowest" if slowest else "")) if stage == 0 else f"stage {stage}")
        spans: dict[tuple[int, str], list[tuple[float, float]]] = {}  # one collection per row and kind
        for stage, _, kind, start_s, end_s in group.blocks:
            spans.setdefault((stage, kind), []).append((start_s * 1e3, (end_s - start_s) * 1e3))
        for (stage, kind), ranges in spans.items():
            colour = FORWARD if kind == "F" else BACKWARD
            axes.broken_barh(ranges, (row + stage, 0.9), facecolors=colour, edgecolors="white", linewidth=0.3)
        row += group.num_stages
    if timeline.histogram is not None:
        histogram = timeline.histogram
        tallest = max(histogram.counts)
        min_width_s = MIN_BAR_SHARE * max(timeline.step_time_s, 1e-12)  # a bar stays visible
        for count, low, high in zip(histogram.counts, histogram.edges_s, histogram.edges_s[1:]):
            height = 1.8 * count / tallest
            width_ms = max(high - low, min_width_s) * 1e3
            axes.broken_barh([(low * 1e3, width_ms)], (row + 2 - height, height), facecolors="#777")
        ticks.append(row + 1)
        labels.append(
            f"{len(timeline.hidden_pipelines)} others: {ms(histogram.edges_s[0])} to {ms(histogram.edges_s[-1])}"
        )
        row += 2
    _marks(axes, timeline, row)
    axes.set_ylim(row, -0.2)
    axes.set_yticks(ticks, labels, fontsize=7)


def _marks(axes, timeline: PlanTimeline, num_rows: int) -> None:
    sync_start_ms = (timeline.step_time_s - timeline.grad_sync_s) * 1e3
    if timeline.grad_sync_s > 0:
        axes.axvspan(sync_start_ms, timeline.step_time_s * 1e3, color=SYNC, alpha=0.35, hatch="//", label="grad sync")
    axes.axvline(timeline.step_time_s * 1e3, color="#222", linewidth=0.8)
    if timeline.lower_bound_s is not None:
        axes.axvline(timeline.lower_bound_s * 1e3, color=BOUND, linestyle="--", linewidth=1.0, label="lower bound")
    if timeline.grad_sync_s > 0 or timeline.lower_bound_s is not None:
        # above the axes, right-aligned: inside, it would hide the slowest blocks and the histogram
        axes.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=7, frameon=False)
