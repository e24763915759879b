"""A sweep's results folder: the rows file it appends to as rows finish, and the final tables.

`rows.jsonl` gets one line per finished configuration, flushed and synced before the next one is
reported, so an interrupted sweep keeps every finished row; `sweep.json` records the configuration
keys, so `--resume` continues the same sweep only (and recomputes nothing that is in the file).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from hydraplan.api.files import InputError
from hydraplan.api.whatif.schemas import Configuration, SweepMeta, WhatifRow

ROWS_FILE, META_FILE = "rows.jsonl", "sweep.json"
CSV_FILE, JSON_FILE, MEMORY_FILE = "rows.csv", "rows.json", "memory.csv"
SCALAR_COLUMNS = [
    "index",
    "model",
    "gpu",
    "num_gpus",
    "gpus_per_node",
    "dataset",
    "context_cap",
    "tokens_per_step",
    "cost_source",
    "planner",
    "num_steps",
    "status",
    "reason",
    "mean_tokens",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "gap",
    "plan_status",
    "strategy",
    "price_per_gpu_hour",
    "cost_per_hour",
    "cost_per_1m_tokens",
    "max_context_any_scheme_tokens",
    "max_context_every_scheme_tokens",
]


class RowsFile:
    """The append-only rows of one sweep in `folder`."""

    def __init__(self, folder: Path, configurations: Sequence[Configuration], resume: bool) -> None:
        self.folder = folder
        self.keys = [configuration.key() for configuration in configurations]
        self.finished: dict[str, WhatifRow] = self._start(resume)
        self._stream: IO[str] | None = None

    def _start(self, resume: bool) -> dict[str, WhatifRow]:
        rows_path, meta_path = self.folder / ROWS_FILE, self.folder / META_FILE
        if not resume:
            if rows_path.exists() and rows_path.stat().st_size:
                raise InputError(
                    f"--out {self.folder}: holds the rows of a sweep already; add --resume to continue it, "
                    "or choose another folder"
                )
            self.folder.mkdir(parents=True, exist_ok=True)
            meta_path.write_text(SweepMeta(keys=self.keys).model_dump_json(indent=2) + "\n", encoding="utf-8")
            rows_path.write_text("", encoding="utf-8")
            return {}
        if not meta_path.exists():
            raise InputError(f"--resume: {self.folder} holds no sweep ({META_FILE} is missing)")
        try:
            meta = SweepMeta.model_validate_json(meta_path.read_text(encoding="utf-8"))
        except ValidationError:
            raise InputError(f"--resume: {meta_path} is not a sweep record") from None
        if meta.keys != self.keys:
            raise InputError(
                f"--resume: {self.folder} holds another sweep ({len(meta.keys)} configurations, "
                f"{len(set(meta.keys) - set(self.keys))} of them not in this one); give the same axes or another --out"
            )
        return read_rows(rows_path, set(self.keys))

    def append(self, row: WhatifRow) -> None:
        """Write one finished row, durably, before anything else is reported."""
        if self._stream is None:
            self._stream = (self.folder / ROWS_FILE).open("a", encoding="utf-8")
        self._stream.write(row.model_dump_json() + "\n")
        self._stream.flush()
        os.fsync(self._stream.fileno())
        self.finished[row.key] = row

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def rows(self) -> list[WhatifRow]:
        """The finished rows in sweep order."""
        return [self.finished[key] for key in self.keys if key in self.finished]


def read_rows(path: Path, keys: set[str]) -> dict[str, WhatifRow]:
    """Rows of a rows file by key; a torn last line (the sweep was killed mid-write) is dropped."""
    rows: dict[str, WhatifRow] = {}
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for number, line in enumerate(lines, start=1):
        try:
            row = WhatifRow.model_validate_json(line)
        except ValidationError:
            if number == len(lines):
                break
            raise InputError(f"--resume: {path} line {number} is not a row") from None
        if row.key in keys:
            rows[row.key] = row
    return rows


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


def table_columns(rows: Sequence[WhatifRow]) -> list[str]:
    """The CSV header: the scalar fields, one speedup column per baseline, mix and steps."""
    baselines = sorted({name for row in rows for name in (*row.speedups, *row.baseline_errors)})
    return [*SCALAR_COLUMNS, *(f"speedup_{name}" for name in baselines), "strategy_mix", "step_times_s"]


def flat_row(row: WhatifRow, columns: Sequence[str]) -> dict[str, Any]:
    values: dict[str, Any] = {column: getattr(row, column) for column in SCALAR_COLUMNS}
    for column in columns:
        if column.startswith("speedup_"):
            values[column] = row.speedups.get(column.removeprefix("speedup_"))
    values["strategy_mix"] = " ".join(f"{scheme}:{share:.4f}" for scheme, share in row.strategy_mix.items())
    values["step_times_s"] = " ".join(repr(value) for value in row.step_times_s)
    return {column: "" if values[column] is None else values[column] for column in columns}


def write_tables(folder: Path, rows: Sequence[WhatifRow], meta: dict[str, Any]) -> list[Path]:
    """rows.csv, rows.json (rows and `meta`: cost source, answers) and memory.csv."""
    columns = table_columns(rows)
    with (folder / CSV_FILE).open("w", encoding="utf-8", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat_row(row, columns) for row in rows)
    document = {**meta, "rows": [row.model_dump(mode="json") for row in rows]}
    (folder / JSON_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    with (folder / MEMORY_FILE).open("w", encoding="utf-8", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["model", "gpu", "num_gpus", "gpus_per_node", "cost_source", "scheme", "capacity_tokens"])
        writer.writerows(memory_rows(rows))
    return [folder / CSV_FILE, folder / JSON_FILE, folder / MEMORY_FILE]


def memory_rows(rows: Sequence[WhatifRow]) -> list[list[Any]]:
    """Each cluster's schemes and the longest sequence each holds, once per cluster."""
    seen: set[tuple] = set()
    table = []
    for row in rows:
        cluster = (row.model, row.gpu, row.num_gpus, row.gpus_per_node, row.cost_source)
        if cluster in seen:
            continue
        seen.add(cluster)
        table.extend([*cluster, scheme, capacity] for scheme, capacity in row.scheme_capacity_tokens.items())
    return table
