"""One self-contained HTML report of a sweep, answer first: a short summary (the questions
answered, the fastest configuration, the speedups) and the throughput figure, then the other
figures, the table, the memory study and what the cost source's error is known to be; the raw
spec last, collapsed. Figures are PNG embedded as data URIs. The page is templates/report.html.j2
(Jinja2, autoescaped); this module computes what it shows.

The page is sized for a laptop window: a bounded width, tables that scroll inside their own box
(horizontally and, past a screenful, vertically) instead of widening or lengthening the page.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from hydraplan.api.whatif.questions import Answer, describe
from hydraplan.api.whatif.results import SCALAR_COLUMNS, flat_row, memory_rows, table_columns
from hydraplan.api.whatif.schemas import ANALYTIC, Configuration, RowStatus, WhatifRow

REPORT_FILE = "report.html"
TEMPLATE = "report.html.j2"  # in templates/, rendered by jinja2 (the whatif extra)
KEY_FIGURE = "throughput"
WIDE_FIGURES = {"speedup"}  # one panel per baseline: given the grid's full width
# What benchmarks/RESULTS.md publishes about each cost source's error (tests/test_whatif.py checks
# that every figure quoted here is in the named section, so a rerun that changes one fails a test).
ANALYTIC_ERROR = (
    "Analytic model (cost_models/analytic.py, default options): FLOPs, bytes and bandwidths from the "
    "catalog's vendor specs, with per-GPU achieved efficiencies (cost_models/data/efficiency.json; 55% of "
    "BF16 peak for matmuls and 45% for attention on a GPU without an entry). Its published error is in "
    "benchmarks/RESULTS.md: against published training runs (section published), predicted over published "
    "tokens/s per GPU has a median of 1.08 on 11 held-out runs (range 1.00-1.22, all within +-30%); on a CPU "
    "(headline figures, section cost_model_accuracy), its formulas with the hardware parameters calibrated "
    "have a stage-time error with a median of 12.5% on schemes the calibration did not see. Absolute times "
    "may be off by as much; comparisons between configurations share the same assumptions."
)
PROFILE_ERROR = (
    "Profile {label} (source: {source}, model {model}, GPU {gpu}). The file carries no error of its own; for "
    "profiles fitted by `hydraplan profile`, benchmarks/RESULTS.md (headline figures, section "
    "cost_model_accuracy) publishes the stage-time error on held-out micro-batches measured on a CPU: "
    "median 9.0%, p95 22.0%. Its notes say: {notes}"
)
STYLE = """
body{font-family:system-ui,sans-serif;line-height:1.4;max-width:72rem;margin:0 auto;padding:1rem 1.5rem}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:1.6em}
.summary li{margin:.3em 0}.note{color:#444;font-size:.9em}
.box{display:inline-block;max-width:100%;overflow:auto;max-height:70vh;border:1px solid #ccc;margin:.5em 0}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}
th{position:sticky;top:0;background:#eee;white-space:normal;min-width:4em;max-width:9em;vertical-align:bottom}
td.t{text-align:left}td.w{white-space:normal;min-width:14em;text-align:left}
tr.failed td{color:#a00}
figure{margin:.5em 0}figure.wide{grid-column:1/-1}img{max-width:100%;height:auto;border:1px solid #ddd}
.figures{display:grid;grid-template-columns:repeat(auto-fit,minmax(24rem,1fr));gap:1rem}
details pre{overflow:auto;max-height:60vh;background:#f6f6f6;padding:.5em}
"""
# Readable headers of the table's columns (speedup_<baseline> columns are named from the baseline).
COLUMN_LABELS = {
    "index": "row",
    "model": "model",
    "gpu": "GPU",
    "num_gpus": "GPUs",
    "gpus_per_node": "GPUs per node",
    "dataset": "dataset",
    "context_cap": "context cap (tokens)",
    "tokens_per_step": "tokens per step",
    "cost_source": "cost source",
    "planner": "planner",
    "num_steps": "steps",
    "status": "status",
    "reason": "why not planned",
    "mean_tokens": "mean tokens per step",
    "step_time_s": "step time (s)",
    "tokens_per_s": "tokens/s",
    "tokens_per_s_per_gpu": "tokens/s per GPU",
    "mfu": "MFU",
    "gap": "gap to its planner's bound",  # a baseline planning alone: the baseline's own bound
    "plan_status": "plan status",
    "strategy": "strategy (most frequent)",
    "price_per_gpu_hour": "price per GPU-hour",
    "cost_per_hour": "cost per hour",
    "cost_per_1m_tokens": "cost per 1M tokens",
    "max_context_any_scheme_tokens": "longest sequence, some scheme (tokens)",
    "max_context_every_scheme_tokens": "longest sequence, every scheme (tokens)",
    "strategy_mix": "strategy mix (share of GPUs)",
    "step_times_s": "step times (s)",
}
PERCENT_COLUMNS = {"mfu", "gap"}
WRAPPED_COLUMNS = {"reason", "strategy", "strategy_mix", "step_times_s"}


class Cell(NamedTuple):
    """A table cell: its text and its CSS class (`t` text, `w` wrapped, None a number)."""

    text: str
    css: str | None


class SummaryItem(NamedTuple):
    """One line of the summary: a bold label, then the text."""

    label: str
    text: str


def cost_source_statements(configurations: Sequence[Configuration]) -> list[str]:
    """One sentence per cost source of the sweep: what it is and what is published about its error."""
    statements: dict[str, str] = {}
    for configuration in configurations:
        source = configuration.cost_source
        if source.label in statements:
            continue
        if source.label == ANALYTIC or source.profile is None:
            statements[source.label] = ANALYTIC_ERROR
        else:
            profile = source.profile
            statements[source.label] = PROFILE_ERROR.format(
                label=source.label,
                source=profile.source,
                model=profile.model or "unnamed",
                gpu=profile.gpu or "unnamed",
                notes=profile.notes or "(none)",
            )
    return list(statements.values())


def column_label(column: str) -> str:
    """The header of a table column: words, not the CSV's snake_case name."""
    if column.startswith("speedup_"):
        return f"speedup over {column.removeprefix('speedup_')}"
    return COLUMN_LABELS.get(column, column.replace("_", " "))


def _format(column: str, value: object) -> str:
    if value == "" or value is None:
        return ""
    if column in PERCENT_COLUMNS and isinstance(value, float):
        return f"{value * 100:.2f}%"
    if column.startswith("speedup_") and isinstance(value, float):
        return f"{value:.3f}x"
    if column == "strategy_mix" and isinstance(value, str):
        return ", ".join(f"{scheme} {float(share):.0%}" for scheme, share in (p.rsplit(":", 1) for p in value.split()))
    if column == "step_times_s" and isinstance(value, str):
        return ", ".join(f"{float(time_s):.4g}" for time_s in value.split())
    if isinstance(value, bool) or column == "index":
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def _cell(column: str, value: object) -> Cell:
    text = _format(column, value)
    if column in WRAPPED_COLUMNS:
        return Cell(text, "w")
    numeric = column in SCALAR_COLUMNS and not isinstance(value, str) or column.startswith("speedup_")
    return Cell(text, None if numeric else "t")


def _shared_columns(rows: Sequence[WhatifRow], columns: Sequence[str]) -> dict[str, str]:
    """Columns with one value in every row (shown once above the table, not in it); empty ones
    are dropped silently. With a single row nothing is shared: the table is the row."""
    if len(rows) < 2:
        return {}
    flats = [flat_row(row, columns) for row in rows]
    shared = {}
    for column in columns:
        values = {_format(column, flat[column]) for flat in flats}
        if len(values) == 1 and column != "index":
            shared[column] = values.pop()
    return shared


def _table(rows: Sequence[WhatifRow]) -> dict:
    """The configurations table: the columns shown, one row of cells per configuration, and the
    values every configuration shares (said once above the table)."""
    columns = table_columns(rows)
    shared = _shared_columns(rows, columns)
    shown = [column for column in columns if column not in shared]
    body = []
    for row in rows:
        values = flat_row(row, shown)
        body.append({"failed": bool(row.reason), "cells": [_cell(column, values[column]) for column in shown]})
    common = "; ".join(f"{column_label(column)} {value}" for column, value in shared.items() if value)
    return {"labels": [column_label(column) for column in shown], "rows": body, "common": common}


def _memory_table(rows: Sequence[WhatifRow]) -> dict | None:
    """One row per scheme, one column per cluster: the longest sequence the scheme holds there
    (None: no cluster has a runnable scheme)."""
    capacities: dict[tuple, dict[str, int]] = {}
    for model, gpu, num_gpus, per_node, source, scheme, capacity in memory_rows(rows):
        capacities.setdefault((model, gpu, num_gpus, per_node, source), {})[scheme] = capacity
    if not capacities:
        return None
    clusters = list(capacities)
    varying = [position for position in (0, 3, 4) if len({cluster[position] for cluster in clusters}) > 1]
    labels = [
        ", ".join([f"{cluster[2]:,} x {cluster[1]}", *(str(cluster[position]) for position in varying)])
        for cluster in clusters
    ]
    schemes = list(dict.fromkeys(scheme for cluster in clusters for scheme in capacities[cluster]))
    body = [(scheme, [_memory_cell(capacities[cluster].get(scheme)) for cluster in clusters]) for scheme in schemes]
    return {"labels": labels, "rows": body}


def _memory_cell(capacity: int | None) -> str:
    return "-" if capacity is None else f"{capacity:,}"


def _summary(rows: Sequence[WhatifRow], answers: Sequence[Answer]) -> dict:
    """The answer first: the questions asked, the fastest and cheapest configurations, speedups."""
    failed = sum(1 for row in rows if row.status == RowStatus.FAILED)
    ok = [row for row in rows if row.status == RowStatus.OK and row.tokens_per_s is not None]
    items = [SummaryItem(a.question, a.text) for a in answers]
    if ok:
        fastest = max(ok, key=lambda row: (row.tokens_per_s or 0.0, -row.index))
        items.append(
            SummaryItem(
                "fastest",
                f"{describe(fastest)}: {fastest.tokens_per_s:,.0f} tokens/s (step time {fastest.step_time_s:.4g} s)",
            )
        )
        priced = [row for row in ok if row.cost_per_1m_tokens is not None]
        if priced:
            cheapest = min(priced, key=lambda row: (row.cost_per_1m_tokens or 0.0, row.index))
            items.append(
                SummaryItem(
                    "cheapest per 1M tokens", f"{describe(cheapest)}: {cheapest.cost_per_1m_tokens:.4g} per 1M tokens"
                )
            )
    for baseline in sorted({name for row in ok for name in row.speedups}):
        speedups = [row.speedups[baseline] for row in ok if baseline in row.speedups]
        spread = f"{min(speedups):.3f}x" + (f" to {max(speedups):.3f}x" if max(speedups) > min(speedups) else "")
        items.append(
            SummaryItem(
                f"speedup over {baseline}",
                f"{spread} over {len(speedups)} configuration(s) (each the geometric mean over its steps)",
            )
        )
    return {"counts": f"{len(rows)} configuration(s), {failed} could not be planned.", "lines": items}


def _image(path: Path) -> dict:
    """A PNG figure to embed as a data URI (`wide`: given the figure grid's full width)."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return {"wide": path.stem in WIDE_FIGURES, "alt": path.stem, "data": data}


def write_report(
    folder: Path,
    rows: Sequence[WhatifRow],
    configurations: Sequence[Configuration],
    answers: Sequence[Answer],
    figures: Sequence[Path],
    spec_json: str,
) -> Path:
    """Write report.html into `folder` (figures: the files to embed, PNG ones; spec_json: the
    sweep's spec, shown collapsed at the end)."""
    images = [path for path in figures if path.suffix == ".png"]
    html = _template().render(
        style=STYLE,
        summary=_summary(rows, answers),
        key_figures=[_image(path) for path in images if path.stem == KEY_FIGURE],
        other_figures=[_image(path) for path in images if path.stem != KEY_FIGURE],
        table=_table(rows),
        memory=_memory_table(rows),
        statements=cost_source_statements(configurations),
        spec_json=spec_json,
    )
    path = folder / REPORT_FILE
    path.write_text(html, encoding="utf-8")
    return path


def _template():
    """templates/report.html.j2 (package data), autoescaped: every value filled in is text."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("hydraplan.api.whatif", "templates"),
        autoescape=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    return environment.get_template(TEMPLATE)
