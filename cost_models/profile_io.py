"""Read and write `CostProfile` JSON files, with errors that name the file and the field.

A profile file is the JSON form of `planner.schemas.CostProfile`. The smallest useful one::

    {"time_unit": "ms", "num_layers": 32,
     "schemes": [{"tp": 8, "pp": 1, "cp": 1, "a": 1e-7, "b": 2e-3, "c": 1.0,
                  "capacity_tokens": 32768}]}

A scheme may give `static_bytes` and `activation_bytes_per_token` instead of `capacity_tokens`
when the top level has `gpu_memory_bytes`; the capacity is then derived. `schema_version` may be
omitted (it defaults to the current one); any other version is refused.

The helpers `read_json_object` and `format_validation_error` are shared with `catalog`, and
`read_input_text` (at most `limits.MAX_INPUT_FILE_BYTES` of a file or a stream) with every reader
of the command line.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from hydraplan.planner.limits import MAX_INPUT_FILE_BYTES
from hydraplan.planner.schemas import PROFILE_SCHEMA, CostProfile

__all__ = ["BUNDLED_PROFILES", "ProfileError", "bundled_profile", "load_profile", "save_profile"]

# Measured profiles shipped in cost_models/data/, by name. `tiny-cpu` is regenerated with
# `hydraplan profile --device cpu --model tiny --out cost_models/data/tiny-cpu.json
#  --token-counts 128 256 512 1024 1536 --repeats 2 --budget-s 600` (past the longest sequence,
# 1,150 tokens, of `benchmarks/runtime_vs_model.py`'s batches: the stage time of one long
# sequence grows faster than the fit's square beyond the measured counts). Last regenerated
# 2026-12-03 (real-peak memory fit, one 3,072-token sequence, the CPU heap pinned: 474 s).
BUNDLED_PROFILES = {"tiny-cpu": "tiny-cpu.json"}


class ProfileError(ValueError):
    """A profile cannot be read; the message names the file, the field path and the problem."""


def format_location(location: tuple[int | str, ...]) -> str:
    """Render a pydantic error location as a field path: ('schemes', 2, 'a') -> 'schemes[2].a'."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def format_validation_error(error: ValidationError, location_prefix: tuple[int | str, ...] = ()) -> str:
    """One 'field.path: problem' clause per pydantic error, joined with '; '.

    `location_prefix` is prepended to every location (e.g. ('models', 1) for a catalog entry).
    """
    clauses = []
    for detail in error.errors():
        message = str(detail["msg"]).removeprefix("Value error, ")
        path = format_location(location_prefix + tuple(detail["loc"]))
        clauses.append(f"{path}: {message}" if path else message)
    return "; ".join(clauses)


READ_CHUNK_CHARACTERS = 1 << 16


def read_input_text(path: Path, error_type: type[ValueError] = ValueError) -> str:
    """A UTF-8 text file a command reads, at most `limits.MAX_INPUT_FILE_BYTES` of it: a larger
    regular file is refused (`error_type`, naming it) before it is read, a pipe or a device (`<(...)`,
    /dev/stdin; /dev/zero has no end) once it has given more (`read_capped`). A missing or
    unreadable file raises the `OSError`; undecodable bytes the `UnicodeDecodeError`."""
    if path.is_dir():
        raise error_type(f"{path}: a directory, not a file")
    if not path.is_file():
        with path.open(encoding="utf-8") as stream:
            return read_capped(stream, str(path), error_type)
    size = path.stat().st_size
    if size > MAX_INPUT_FILE_BYTES:
        raise error_type(f"{path}: {size:,} bytes, more than the limit of {MAX_INPUT_FILE_BYTES:,}")
    return path.read_text(encoding="utf-8")


def read_capped(stream: TextIO, label: str, error_type: type[ValueError] = ValueError) -> str:
    """All of a text stream, refused (`error_type`, naming `label`) once it gives more than
    `limits.MAX_INPUT_FILE_BYTES` characters: a stream without end is not read without end."""
    parts, total = [], 0
    while chunk := stream.read(READ_CHUNK_CHARACTERS):  # decoded as it comes: a binary stream fails at once
        total += len(chunk)
        if total > MAX_INPUT_FILE_BYTES:
            raise error_type(f"{label}: more than the limit of {MAX_INPUT_FILE_BYTES:,} characters")
        parts.append(chunk)
    return "".join(parts)


def read_json_object(path: Path, error_type: type[ValueError]) -> dict[str, Any]:
    """Parse a JSON file whose top level must be an object; failures raise `error_type`."""
    try:
        text = read_input_text(path, error_type)
    except FileNotFoundError:
        raise error_type(f"{path}: no such file") from None
    except OSError as exc:
        raise error_type(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error_type(f"{path}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError as exc:  # arrays or objects nested deeper than Python's parser recurses
        raise error_type(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise error_type(f"{path}: the top level must be a JSON object, got {type(data).__name__}")
    return data


def load_profile(source: str | Path | dict[str, Any]) -> CostProfile:
    """Load and validate a cost profile from a JSON file path or an already parsed dict.

    Raises `ProfileError` naming the file (or '<profile>' for a dict), the field path and the
    problem, e.g. ``p.json: schemes[2].a: Input should be greater than or equal to 0``.
    """
    if isinstance(source, dict):
        name, data = "<profile>", source
    else:
        name = str(source)
        data = read_json_object(Path(source), ProfileError)
    version = data.get("schema_version", PROFILE_SCHEMA)
    if version != PROFILE_SCHEMA:
        raise ProfileError(
            f"{name}: schema_version: {version!r} is not supported (this hydraplan reads {PROFILE_SCHEMA!r})"
        )
    try:
        return CostProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{name}: {format_validation_error(exc)}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_profile(profile: CostProfile, path: str | Path) -> None:
    """Write `profile` as indented JSON; `load_profile` of the file gives an equal profile.

    Atomic: the text goes to a temporary file next to `path`, renamed over it once complete, so an
    interrupted write never leaves a half-written profile (the old file, if any, stays).
    """
    target = Path(path)
    text = profile.model_dump_json(indent=2) + "\n"
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    except OSError as exc:  # name the file asked for, not the temporary one beside it
        raise OSError(exc.errno, exc.strerror, str(target)) from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's file is private; give it a new file's mode
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def bundled_profile(name: str = "tiny-cpu") -> CostProfile:
    """A measured profile shipped with hydraplan (`BUNDLED_PROFILES`): `tiny-cpu` is the `tiny`
    model measured on a CPU, the runtime's default cost source."""
    try:
        file_name = BUNDLED_PROFILES[name]
    except KeyError:
        raise ProfileError(f"unknown bundled profile {name!r}; valid: {', '.join(BUNDLED_PROFILES)}") from None
    with resources.as_file(resources.files("hydraplan.cost_models").joinpath("data", file_name)) as path:
        return load_profile(path)
