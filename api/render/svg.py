"""SVG and HTML drawings of a `TimelineDocument` (pure: a document in, text out).

One panel per plan, all on the document's time axis: one row per PP stage of every drawn group,
forward blocks light and backward blocks dark, each labelled with its micro-batch (when wide
enough) and carrying its exact times in `data-*` attributes (`repr` of the simulator's floats, so
a reader gets the same numbers back). Idle time is the grey row behind the blocks. Marks: the
gradient synchronisation after the slowest pipeline (hatched), the slowest pipeline's label, the
lower bound as a dashed line, and the histogram of the pipelines not drawn.

The HTML page is the SVG plus the document itself as JSON in
`<script type="application/json" id="hydraplan-timeline">`.
"""

from __future__ import annotations

import json
import math
from xml.sax.saxutils import escape, quoteattr

from hydraplan.api.render.timeline import PipelineGroup, PlanTimeline, TimelineDocument

WIDTH = 1200
LEFT = 190  # the labels' column
RIGHT = 30
PLOT_WIDTH = WIDTH - LEFT - RIGHT
ROW = 12  # height of one stage row
ROW_GAP = 2
GROUP_GAP = 10
TITLE = 36  # a panel's two title lines
HISTOGRAM = 46
AXIS = 34
MIN_LABEL_WIDTH = 13  # px a block needs to carry its micro-batch number
FORWARD, BACKWARD, IDLE = "#8cbbe8", "#2b62a8", "#ececec"
SYNC, BOUND, SLOWEST = "#e59b2e", "#c62828", "#c62828"
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"


def render_svg(document: TimelineDocument) -> str:
    """The whole timeline as one standalone SVG document."""
    scale = _Scale(document.time_max_s)
    parts, y = [], 8
    for index, timeline in enumerate(document.plans):
        panel, height = _panel(index, timeline, scale, y)
        parts.append(panel)
        y += height
    parts.append(_axis(scale, y))
    height = y + AXIS
    header = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' viewBox='0 0 {WIDTH} {height}' "
        f"{FONT} font-size='11' class='hydraplan-timeline' data-time-max-s='{document.time_max_s!r}'>"
    )
    defs = (
        "<defs><pattern id='hp-sync' width='6' height='6' patternUnits='userSpaceOnUse' "
        f"patternTransform='rotate(45)'><rect width='3' height='6' fill='{SYNC}' opacity='0.55'/></pattern></defs>"
        f"<rect width='{WIDTH}' height='{height}' fill='white'/>"
    )
    return header + defs + "".join(parts) + "</svg>\n"


def render_html(document: TimelineDocument) -> str:
    """A self-contained page: a title, the SVG, and the document as embedded JSON."""
    title = " vs ".join(timeline.label for timeline in document.plans)
    data = json.dumps(document.model_dump(mode="json"), separators=(",", ":")).replace("</", "<\\/")
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>hydraplan timeline: {escape(title)}</title>"
        "<style>body{font-family:'DejaVu Sans',Arial,sans-serif;margin:16px;color:#222}"
        "svg rect[data-kind]:hover{stroke:#000;stroke-width:1}</style></head><body>"
        f"<h1 style='font-size:18px'>1F1B timeline: {escape(title)}</h1>"
        "<p>One row per pipeline stage; light blocks are forwards, dark ones backwards, numbered by "
        "micro-batch; grey is idle time. Hover a block for its times.</p>"
        f"{render_svg(document)}"
        f"<script type='application/json' id='hydraplan-timeline'>{data}</script>"
        "</body></html>\n"
    )


class _Scale:
    """Seconds to x pixels on the shared axis."""

    def __init__(self, time_max_s: float) -> None:
        self.time_max_s = time_max_s if time_max_s > 0 else 1.0

    def x(self, time_s: float) -> float:
        return LEFT + PLOT_WIDTH * time_s / self.time_max_s

    def width(self, duration_s: float) -> float:
        return PLOT_WIDTH * duration_s / self.time_max_s


def ms(seconds: float) -> str:
    """`812.3 ms`, `4.56 ms` (three significant digits below 10 ms)."""
    milliseconds = seconds * 1e3
    return f"{milliseconds:,.1f} ms" if abs(milliseconds) >= 10 else f"{milliseconds:.3g} ms"


def plan_heading(timeline: PlanTimeline) -> tuple[str, str]:
    """A panel's title and its facts line (shared with the PNG drawing)."""
    title = f"{timeline.label}: {timeline.strategy}"
    facts = [f"step {ms(timeline.step_time_s)}", f"grad sync {ms(timeline.grad_sync_s)}"]
    if timeline.lower_bound_s is not None:
        facts.append(f"lower bound {ms(timeline.lower_bound_s)}")
    facts.append(f"{timeline.num_pipelines} pipelines, slowest #{timeline.slowest_pipeline}")
    if timeline.hidden_pipelines:
        facts.append(f"{len(timeline.hidden_pipelines)} not drawn (histogram)")
    return title, ", ".join(facts)


def group_label(group: PipelineGroup) -> str:
    """`#3 <4,2,1>` or `#3,5,9 <4,2,1> x3` (at most four indices spelled out)."""
    shown = ",".join(str(index) for index in group.pipelines[:4]) + (",..." if len(group.pipelines) > 4 else "")
    count = f" x{len(group.pipelines)}" if len(group.pipelines) > 1 else ""
    return f"#{shown} {group.scheme}{count}"


def _panel(plan_index: int, timeline: PlanTimeline, scale: _Scale, top: float) -> tuple[str, float]:
    """One plan's panel starting at y `top`; returns its SVG and height."""
    title, facts = plan_heading(timeline)
    parts = [
        f"<g class='plan' data-plan='{plan_index}' data-label={quoteattr(timeline.label)} "
        f"data-step-time-s='{timeline.step_time_s!r}'>",
        f"<text x='8' y='{top + 14}' font-size='14' font-weight='bold'>{escape(title)}</text>",
        f"<text x='8' y='{top + 29}' fill='#444'>{escape(facts)}</text>",
    ]
    y = top + TITLE
    rows_top = y
    for group in timeline.groups:
        parts.append(_group(plan_index, group, group.pipelines[0] == timeline.slowest_pipeline, scale, y))
        y += group.num_stages * (ROW + ROW_GAP) + GROUP_GAP
    rows_bottom = y - GROUP_GAP
    if timeline.histogram is not None:
        parts.append(_histogram(timeline, scale, y))
        y += HISTOGRAM
    parts.append(_marks(timeline, scale, rows_top, rows_bottom))
    parts.append("</g>")
    return "".join(parts), y - top + 8


def _group(plan_index: int, group: PipelineGroup, slowest: bool, scale: _Scale, top: float) -> str:
    label = group_label(group) + ("  slowest" if slowest else "")
    colour = SLOWEST if slowest else "#222"
    weight = " font-weight='bold'" if slowest else ""
    flag = " data-slowest='true'" if slowest else ""
    members = ",".join(map(str, group.pipelines))
    parts = [
        f"<g class='pipeline' data-pipelines='{members}' data-scheme={quoteattr(group.scheme)} "
        f"data-time-s='{group.time_s!r}'{flag}>",
        f"<text x='8' y='{top + ROW - 2}' fill='{colour}'{weight}>{escape(label)}</text>",
    ]
    for stage in range(group.num_stages):
        y = top + stage * (ROW + ROW_GAP)
        parts.append(
            f"<rect x='{LEFT}' y='{y}' width='{scale.width(group.time_s):.2f}' height='{ROW}' fill='{IDLE}'/>"
            f"<text x='{LEFT - 4}' y='{y + ROW - 3}' text-anchor='end' font-size='9' fill='#777'>stage {stage}</text>"
        )
    first = group.pipelines[0]
    for stage, micro_batch, kind, start_s, end_s in group.blocks:
        parts.append(_block(plan_index, first, stage, micro_batch, kind, start_s, end_s, scale, top))
    parts.append("</g>")
    return "".join(parts)


def _block(
    plan_index: int,
    pipeline: int,
    stage: int,
    micro_batch: int,
    kind: str,
    start_s: float,
    end_s: float,
    scale: _Scale,
    top: float,
) -> str:
    x, width = scale.x(start_s), scale.width(end_s - start_s)
    y = top + stage * (ROW + ROW_GAP)
    name = "forward" if kind == "F" else "backward"
    tooltip = f"pipeline {pipeline} stage {stage} {name} micro-batch {micro_batch}: {ms(start_s)} to {ms(end_s)}"
    rect = (
        f"<rect x='{x:.2f}' y='{y}' width='{max(width, 0.3):.2f}' height='{ROW}' "
        f"fill='{FORWARD if kind == 'F' else BACKWARD}' stroke='white' stroke-width='0.4' "
        f"data-plan='{plan_index}' data-pipeline='{pipeline}' data-stage='{stage}' data-micro-batch='{micro_batch}' "
        f"data-kind='{kind}' data-start-s='{start_s!r}' data-end-s='{end_s!r}'><title>{tooltip}</title></rect>"
    )
    if width < MIN_LABEL_WIDTH:
        return rect
    fill = "#123" if kind == "F" else "white"
    return rect + (
        f"<text x='{x + width / 2:.2f}' y='{y + ROW - 3}' text-anchor='middle' font-size='8' fill='{fill}' "
        f"pointer-events='none'>{micro_batch}</text>"
    )


def _marks(timeline: PlanTimeline, scale: _Scale, top: float, bottom: float) -> str:
    """The gradient sync band after the slowest pipeline and the lower bound line."""
    parts = []
    height = max(bottom - top, ROW)
    sync_start_s = timeline.step_time_s - timeline.grad_sync_s
    if timeline.grad_sync_s > 0:
        parts.append(
            f"<rect class='grad-sync' x='{scale.x(sync_start_s):.2f}' y='{top}' "
            f"width='{max(scale.width(timeline.grad_sync_s), 1.0):.2f}' height='{height}' fill='url(#hp-sync)' "
            f"stroke='{SYNC}' data-start-s='{sync_start_s!r}' data-end-s='{timeline.step_time_s!r}'>"
            f"<title>gradient sync {ms(timeline.grad_sync_s)}</title></rect>"
        )
    step_x = scale.x(timeline.step_time_s)
    parts.append(
        f"<line class='step-end' x1='{step_x:.2f}' x2='{step_x:.2f}' y1='{top - 4}' y2='{top + height}' "
        f"stroke='#222' stroke-width='1'/>"
    )
    if timeline.lower_bound_s is not None:
        x = scale.x(timeline.lower_bound_s)
        parts.append(
            f"<line class='lower-bound' x1='{x:.2f}' x2='{x:.2f}' y1='{top - 4}' y2='{top + height}' "
            f"stroke='{BOUND}' stroke-width='1.2' stroke-dasharray='4 3' data-time-s='{timeline.lower_bound_s!r}'>"
            f"<title>lower bound {ms(timeline.lower_bound_s)}</title></line>"
            f"<text x='{x - 3:.2f}' y='{top - 6}' text-anchor='end' font-size='9' fill='{BOUND}'>lower bound</text>"
        )
    return "".join(parts)


def _histogram(timeline: PlanTimeline, scale: _Scale, top: float) -> str:
    """Pipeline times of the pipelines not drawn: bars on the shared time axis."""
    histogram = timeline.histogram
    assert histogram is not None
    tallest = max(histogram.counts)
    bar_height = HISTOGRAM - 18
    parts = [
        f"<g class='histogram' data-num-pipelines='{len(timeline.hidden_pipelines)}'>",
        f"<text x='8' y='{top + 12}'>{len(timeline.hidden_pipelines)} other pipelines</text>",
        f"<text x='8' y='{top + 24}' fill='#666' font-size='9'>"
        f"times {escape(ms(histogram.edges_s[0]))} to {escape(ms(histogram.edges_s[-1]))}</text>",
    ]
    for count, low, high in zip(histogram.counts, histogram.edges_s, histogram.edges_s[1:]):
        if count == 0:
            continue
        height = bar_height * count / tallest
        width = max(scale.width(high - low), 2.0)
        parts.append(
            f"<rect x='{scale.x(low):.2f}' y='{top + bar_height - height + 4:.2f}' width='{width:.2f}' "
            f"height='{height:.2f}' fill='#9e9e9e' data-count='{count}'>"
            f"<title>{count} pipelines between {ms(low)} and {ms(high)}</title></rect>"
        )
    parts.append("</g>")
    return "".join(parts)


def nice_ticks(time_max_s: float, target: int = 8) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) from 0 to `time_max_s`."""
    if time_max_s <= 0:
        return [0.0]
    raw = time_max_s / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(factor * power for factor in (1, 2, 5, 10) if factor * power >= raw)
    return [index * step for index in range(int(time_max_s / step + 1e-9) + 1)]


def _axis(scale: _Scale, top: float) -> str:
    parts = [
        f"<g class='axis'><line x1='{LEFT}' x2='{LEFT + PLOT_WIDTH}' y1='{top + 4}' y2='{top + 4}' stroke='#222'/>"
    ]
    for tick_s in nice_ticks(scale.time_max_s):
        x = scale.x(tick_s)
        parts.append(
            f"<line x1='{x:.2f}' x2='{x:.2f}' y1='{top + 4}' y2='{top + 8}' stroke='#222'/>"
            f"<text x='{x:.2f}' y='{top + 19}' text-anchor='middle' font-size='10'>{escape(ms(tick_s))}</text>"
        )
    parts.append(f"<text x='{LEFT + PLOT_WIDTH}' y='{top + 31}' text-anchor='end' fill='#555'>time</text></g>")
    return "".join(parts)
