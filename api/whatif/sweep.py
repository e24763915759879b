"""A sweep from start to report: run the unfinished configurations, then price, answer and publish."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydraplan.api.whatif.executors import Executor
from hydraplan.api.whatif.measures import priced
from hydraplan.api.whatif.progress import SweepProgress
from hydraplan.api.whatif.questions import Answer, fastest_within, smallest_clusters
from hydraplan.api.whatif.report import cost_source_statements, write_report
from hydraplan.api.whatif.results import RowsFile, write_tables
from hydraplan.api.whatif.schemas import Configuration, WhatifRow
from hydraplan.api.whatif.spec import SweepSpec


def run_sweep(
    configurations: Sequence[Configuration], executor: Executor, rows_file: RowsFile, progress: SweepProgress
) -> list[WhatifRow]:
    """Evaluate every configuration not yet in `rows_file`; each row is written as it finishes."""
    tasks = [
        (index, configuration)
        for index, configuration in enumerate(configurations)
        if configuration.key() not in rows_file.finished
    ]

    def on_row(row: WhatifRow) -> None:
        rows_file.append(row)
        progress.advance()

    progress.start()
    try:
        executor.run(tasks, on_row)
    finally:
        rows_file.close()
        progress.finish()
    return rows_file.rows()


@dataclass(frozen=True)
class Publication:
    rows: list[WhatifRow]
    answers: list[Answer]
    files: list[Path]


def answer(spec: SweepSpec, rows: Sequence[WhatifRow]) -> list[Answer]:
    """The questions the spec asks, answered from the (priced) rows."""
    answers: list[Answer] = []
    if spec.target_tokens_per_s is not None:
        answers.extend(smallest_clusters(rows, spec.target_tokens_per_s))
    if spec.budget_per_hour is not None:
        answers.append(fastest_within(rows, spec.budget_per_hour))
    return answers


def publish(
    folder: Path,
    spec: SweepSpec,
    configurations: Sequence[Configuration],
    rows: Sequence[WhatifRow],
    command: str,
    plots: bool = True,
) -> Publication:
    """Price the rows, answer the questions, write the tables, the figures and the report."""
    from hydraplan.api.whatif.plots import write_plots

    rows = priced(rows, spec.price_per_gpu_hour)
    answers = answer(spec, rows)
    meta = {
        "schema_version": "hydraplan.whatif-table/1",
        "command": command,
        "cost_sources": cost_source_statements(configurations),
        "prices_per_gpu_hour": spec.price_per_gpu_hour,
        "answers": [item.model_dump(mode="json") for item in answers],
    }
    files = write_tables(folder, rows, meta)
    figures = write_plots(folder / "plots", rows) if plots else []
    files += figures
    files.append(write_report(folder, rows, configurations, answers, figures, command))
    return Publication(list(rows), answers, files)
