"""The files a user hands hydraplan, read and checked: plans, strategy pools, cost profiles, model
and GPU catalogs, and any UTF-8 text (`-` is standard input).

Every failure is an `InputError` (a `ValueError`) whose one-line message names the file:
`batch.bin: not UTF-8 text (byte 0xff at offset 3)`, `plan.json is a cost profile, not a plan`.
The command line (`api.cli.inputs` builds the planner's types from flags on top of these readers)
and the what-if spec files (`api.whatif.spec`) both read through this module. It imports nothing
else of `api`, so the what-if engine, and the service that runs it, never depend on the CLI.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports pydantic and the planner only inside its commands
    from pydantic import ValidationError

    from hydraplan.planner.schemas import CostProfile, GpuSpec, ModelSpec, Plan, PlanRequest

# schema_version of each versioned file hydraplan writes, and what the file is called
DOCUMENT_KINDS = {
    "hydraplan.plan/1": "a plan",
    "hydraplan.profile/1": "a cost profile",
    "hydraplan.pool/1": "a strategy pool",
}
# top-level keys that identify a file without a schema_version (profiles may omit it)
KIND_KEYS = {
    "pipelines": "a plan",
    "schemes": "a cost profile",
    "strategies": "a strategy pool",
    "models": "a model catalog",
    "gpus": "a GPU catalog",
}


class InputError(ValueError):
    """Input the command line cannot use; the message is one line naming the file or flag."""


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


@contextmanager
def naming_file(path: str | Path) -> Iterator[None]:
    """Turn a decoding failure inside the block into an `InputError` naming `path`.

    The library readers (lengths, profiles, catalogs) decode files themselves and their
    `UnicodeDecodeError` names no file; every CLI call of them runs inside this block.
    """
    try:
        yield
    except UnicodeDecodeError as exc:
        raise InputError(f"{_file_label(path)}: {describe_decode_error(exc)}") from None


def describe_decode_error(exc: UnicodeDecodeError) -> str:
    """`not UTF-8 text (byte 0xff at offset 3); is it a binary file?`"""
    byte = exc.object[exc.start] if exc.start < len(exc.object) else None
    where = f"byte 0x{byte:02x} at offset {exc.start}" if byte is not None else f"offset {exc.start}"
    return f"not UTF-8 text ({where}); is it a binary file?"


@contextmanager
def strict_utf8_stdin() -> Iterator[None]:
    """Standard input decoded as strict UTF-8 inside the block (the interpreter's own may escape
    undecodable bytes under a C locale, and `-` must be refused like a binary file)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if not isinstance(buffer, io.BufferedIOBase | io.RawIOBase):  # a replaced stream, e.g. a StringIO
        yield
        return
    original = sys.stdin
    sys.stdin = strict = io.TextIOWrapper(buffer, encoding="utf-8", errors="strict")
    try:
        yield
    finally:
        sys.stdin = original
        strict.detach()  # leaves the buffer open for the interpreter


def _file_label(path: str | Path) -> str:
    return "standard input" if str(path) == "-" else str(path)


def read_text(path: str | Path) -> str:
    """A UTF-8 text file (or standard input for `-`), at most `limits.MAX_INPUT_FILE_BYTES` of it
    (`cost_models.profile_io.read_input_text`: a larger file is refused, a stream once it gives more)."""
    from hydraplan.cost_models.profile_io import read_capped, read_input_text

    with naming_file(path):
        if str(path) == "-":
            return read_capped(sys.stdin, "standard input", InputError)
        return read_input_text(Path(path), InputError)


def read_document(path: str | Path, expected_kind: str) -> Any:
    """Parse a JSON file hydraplan reads as `expected_kind` (e.g. "a plan").

    Refuses, naming the file, text that is not JSON and any other file hydraplan knows (a cost
    profile given as a plan, a plan given as a strategy pool, ...).
    """
    return parse_document(path, read_text(path), expected_kind)


def parse_document(path: str | Path, text: str, expected_kind: str) -> Any:
    """`read_document` of text already read from `path`."""
    invalid = f"{path}: not {expected_kind.replace('a ', 'a valid ', 1)}: not valid JSON"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{invalid}: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError as exc:  # arrays or objects nested deeper than Python's parser recurses
        raise InputError(f"{invalid}: {exc}") from None
    kind = document_kind(data)
    if kind is not None and kind != expected_kind:
        raise InputError(f"{path} is {kind}, not {expected_kind}")
    return data


def document_kind(data: Any) -> str | None:
    """What a parsed JSON file is ("a plan", "a cost profile", ...), None when unrecognised."""
    if not isinstance(data, dict):
        return None
    version = data.get("schema_version")
    if isinstance(version, str) and version in DOCUMENT_KINDS:
        return DOCUMENT_KINDS[version]
    if version is not None:  # an unknown version: let the reader say which one it reads
        return None
    return next((kind for key, kind in KIND_KEYS.items() if key in data), None)


def first_problem(exc: ValidationError) -> str:
    """The first pydantic error as `field.path: problem`, with a count of the others."""
    from hydraplan.cost_models.profile_io import format_location

    errors = exc.errors()
    detail = errors[0]
    message = str(detail["msg"]).removeprefix("Value error, ")
    path = format_location(tuple(detail["loc"]))
    text = f"{path}: {message}" if path else message
    others = len(errors) - 1
    return text + (f" (and {others} more problem{'s' if others > 1 else ''})" if others else "")


# ---------------------------------------------------------------------------------------------
# Plan, request, pool, profile and catalog files
# ---------------------------------------------------------------------------------------------


def read_plan(path: str) -> Plan:
    """A plan file (`hydraplan plan --out`)."""
    from pydantic import ValidationError

    from hydraplan.planner.schemas import PLAN_SCHEMA, Plan

    data = read_document(path, "a plan")
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a valid plan: the top level must be a JSON object, got {_json_type(data)}")
    version = data.get("schema_version", PLAN_SCHEMA)
    if version != PLAN_SCHEMA:
        raise InputError(
            f"{path}: not a valid plan: schema_version {version!r} is not supported "
            f"(this hydraplan reads {PLAN_SCHEMA!r})"
        )
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{path}: not a valid plan: {first_problem(exc)}") from None


def read_request(path: str) -> PlanRequest:
    """A plan request file (the JSON of `hydraplan schema request`: lengths, cluster, options)."""
    from pydantic import ValidationError

    from hydraplan.planner.schemas import PlanRequest

    data = read_document(path, "a plan request")
    if not isinstance(data, dict):
        raise InputError(
            f"{path}: not a valid plan request: the top level must be a JSON object, got {_json_type(data)}"
        )
    try:
        return PlanRequest.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{path}: not a valid plan request: {first_problem(exc)}") from None


def read_pool(path: str) -> list[str]:
    """Strategies of a pool file: the JSON `hydraplan strategies --out` writes, or one per line."""
    from pydantic import ValidationError

    from hydraplan.planner.schemas import StrategyPoolFile

    text = read_text(path)
    if text.lstrip().startswith("{"):
        data = parse_document(path, text, "a strategy pool")
        try:
            return StrategyPoolFile.model_validate(data).strategies
        except ValidationError as exc:
            raise InputError(f"{path}: not a valid strategy pool: {first_problem(exc)}") from None
    strategies = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not strategies:
        raise InputError(f"{path}: no strategies")
    return strategies


def read_profile(path: str) -> CostProfile:
    """A cost profile file; a plan or pool given instead is named as such."""
    from hydraplan.cost_models.profile_io import load_profile

    read_document(path, "a cost profile")
    with naming_file(path):
        return load_profile(path)


def read_models(models_file: str | None) -> dict[str, ModelSpec]:
    """The model catalog, with the entries of `--models-file` on top."""
    from hydraplan.cost_models.catalog import load_models

    if models_file is not None:
        read_document(models_file, "a model catalog")
    with naming_file(models_file or "<catalog>"):
        return load_models(models_file)


def read_gpus(gpus_file: str | None) -> dict[str, GpuSpec]:
    """The GPU catalog, with the entries of `--gpus-file` on top."""
    from hydraplan.cost_models.catalog import load_gpus

    if gpus_file is not None:
        read_document(gpus_file, "a GPU catalog")
    with naming_file(gpus_file or "<catalog>"):
        return load_gpus(gpus_file)


def catalog_model(name: str, models_file: str | None) -> ModelSpec:
    """`--model` from the catalog (and `--models-file`)."""
    from hydraplan.cost_models.catalog import get_model

    if models_file is not None:
        read_document(models_file, "a model catalog")
    with naming_file(models_file or "<catalog>"):
        return get_model(name, extra_path=models_file)


def catalog_gpu(name: str, gpus_file: str | None) -> GpuSpec:
    """`--gpu` from the catalog (and `--gpus-file`)."""
    from hydraplan.cost_models.catalog import get_gpu

    if gpus_file is not None:
        read_document(gpus_file, "a GPU catalog")
    with naming_file(gpus_file or "<catalog>"):
        return get_gpu(name, extra_path=gpus_file)


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
