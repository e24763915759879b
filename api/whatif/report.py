"""One self-contained HTML report of a sweep: the cost source and its published error, the
answers, the table, the memory study and the figures (PNG embedded as data URIs)."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from hydraplan.api.whatif.questions import Answer
from hydraplan.api.whatif.results import SCALAR_COLUMNS, flat_row, memory_rows, table_columns
from hydraplan.api.whatif.schemas import ANALYTIC, Configuration, WhatifRow

REPORT_FILE = "report.html"
# What is published about each cost source's prediction error (none is measured in this repository
# yet: benchmarks/RESULTS.md has no cost-model error section); the report says so, not a guess.
ANALYTIC_ERROR = (
    "Analytic model (cost_models/analytic.py): FLOPs, bytes and bandwidths from the catalog's vendor "
    "specs with assumed efficiencies (55% of BF16 peak for matmuls, 45% for attention). It is "
    "uncalibrated: no measured prediction error is published for it yet (benchmarks/RESULTS.md has no "
    "cost-model error section), so absolute times may be off by the efficiency assumptions; "
    "comparisons between configurations share the same assumptions."
)
PROFILE_ERROR = (
    "Profile {label} (source: {source}, model {model}, GPU {gpu}). The profile format carries no "
    "published prediction error; its notes say: {notes}"
)
STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;font-size:12px}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}"
    "td.t{text-align:left}img{max-width:100%;border:1px solid #ddd;margin:1em 0}.failed{color:#a00}"
)


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


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def _table(rows: Sequence[WhatifRow]) -> str:
    columns = table_columns(rows)
    head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    body = []
    for row in rows:
        values = flat_row(row, columns)
        cells = "".join(
            f'<td class="t">{html.escape(_format(values[column]))}</td>'
            if column not in SCALAR_COLUMNS or isinstance(values[column], str)
            else f"<td>{html.escape(_format(values[column]))}</td>"
            for column in columns
        )
        css = ' class="failed"' if row.reason else ""
        body.append(f"<tr{css}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _memory_table(rows: Sequence[WhatifRow]) -> str:
    header = ["model", "gpu", "GPUs", "per node", "cost source", "scheme", "longest sequence (tokens)"]
    head = "".join(f"<th>{name}</th>" for name in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="t">{html.escape(_format(value))}</td>' for value in entry) + "</tr>"
        for entry in memory_rows(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def write_report(
    folder: Path,
    rows: Sequence[WhatifRow],
    configurations: Sequence[Configuration],
    answers: Sequence[Answer],
    figures: Sequence[Path],
    command: str,
) -> Path:
    """Write report.html into `folder` (figures: the PNG files to embed)."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>hydraplan what-if</title><style>{STYLE}</style>",
        "</head><body><h1>hydraplan what-if study</h1>",
        f"<h2>Study</h2><pre>{html.escape(command)}</pre>",
        f"<p>{len(rows)} configuration(s), {sum(1 for row in rows if row.reason)} could not be planned.</p>",
        "<h2>Cost source</h2>",
        *(f"<p>{html.escape(statement)}</p>" for statement in cost_source_statements(configurations)),
    ]
    if answers:
        parts.append("<h2>Answers</h2><ul>")
        parts.extend(f"<li><b>{html.escape(a.question)}</b>: {html.escape(a.text)}</li>" for a in answers)
        parts.append("</ul>")
    parts.append("<h2>Figures</h2>")
    for path in figures:
        if path.suffix == ".png":
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            parts.append(f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">')
    parts += ["<h2>Table</h2>", _table(rows), "<h2>Memory study</h2>", _memory_table(rows), "</body></html>"]
    path = folder / REPORT_FILE
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path
