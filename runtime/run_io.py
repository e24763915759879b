"""`--data`, `--data-start`, `--save`, `--load` of a run, checked before any rank starts.

`resolve_run_io` is what `hydraplan run` (and the worker under torchrun) calls before launching:
it reads a `--load` checkpoint's `hydraplan.json` (refusing one of another model or dtype), takes
the run's first step number from it and, unless `--data-start` is given, its data cursor (the
document after the last one it trained on), checks every step's plan against the documents
(`token_data.check_batches`) and refuses a `--save` directory holding something other than a
checkpoint. It returns the `RunSpec` fields; every refusal is one line (`PlanRefusedError`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from hydraplan.planner.schemas import Plan
from hydraplan.runtime.assignment import PlanRefusedError
from hydraplan.runtime.checkpoint import META_FILE, CheckpointError, read_checkpoint_meta
from hydraplan.runtime.token_data import TokenDirectory, check_batches

__all__ = ["resolve_run_io"]


def resolve_run_io(
    step_plans: Sequence[Plan],
    cfg,
    dtype: str,
    *,
    data: str | None = None,
    data_start: int | None = None,
    save: str | None = None,
    load: str | None = None,
) -> dict:
    """The `RunSpec` fields `data_path`, `data_start`, `first_step`, `save_dir`, `load_dir`."""
    if data_start is not None and data_start < 0:
        raise PlanRefusedError(f"--data-start {data_start}: must be >= 0")
    first_step, start = 0, data_start
    if load is not None:
        meta = read_checkpoint_meta(load)
        if meta["model"] != cfg.name:
            raise CheckpointError(f"--load {load}: a checkpoint of model {meta['model']!r}, the plan's is {cfg.name!r}")
        if meta["dtype"] != dtype:
            raise CheckpointError(f"--load {load}: saved in {meta['dtype']}, the run is --dtype {dtype}")
        first_step = int(meta["steps_done"])
        if start is None and data is not None and meta.get("data"):
            start = int(meta["data"]["next_document"])
    if data is not None:
        check_batches(
            TokenDirectory.open(data), [p.input_lengths for p in step_plans], start or 0, cfg.vocab_size, first_step
        )
    elif data_start is not None:
        raise PlanRefusedError(f"--data-start {data_start}: needs --data")
    if save is not None:
        _check_save_dir(save)
    return {
        "data_path": None if data is None else os.path.abspath(data),
        "data_start": start or 0,
        "first_step": first_step,
        "save_dir": None if save is None else os.path.abspath(save),
        "load_dir": None if load is None else os.path.abspath(load),
    }


def _check_save_dir(save: str) -> None:
    path = Path(save)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"--save {save}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not (path / META_FILE).is_file():
        raise CheckpointError(f"--save {save}: a non-empty directory that is not a hydraplan checkpoint")
