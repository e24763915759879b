"""Everything the `hydraplan` command line reads: files, and the planner types built from flags.

Every failure is an `InputError` (a `ValueError`) whose one-line message names the file or the
flag: `batch.bin: not UTF-8 text (byte 0xff at offset 3)`, `plan.json is a cost profile, not a
plan`, `--num-gpus 12: not a multiple of --gpus-per-node 8`. The planner's own validators stay
the single source of the rules; `describe_request_error` only translates their field names into
flags, so a validator added to `PlanRequest` or `SolverOptions` gets a CLI message for free.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports pydantic and the planner only inside its commands
    from pydantic import ValidationError

    from hydraplan.planner.schemas import CostProfile, GpuSpec, ModelSpec, Plan, PlanRequest, SolverOptions

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
# request fields whose value comes from another flag than `--<field-name>`
SAMPLED_LENGTHS_FLAG = "--num-tokens"
PREVIOUS_PLAN_FLAG = "--previous-plan"


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
    """A UTF-8 text file (or standard input for `-`)."""
    with naming_file(path):
        if str(path) == "-":
            return sys.stdin.read()
        return Path(path).read_text(encoding="utf-8")


def read_document(path: str | Path, expected_kind: str) -> Any:
    """Parse a JSON file hydraplan reads as `expected_kind` (e.g. "a plan").

    Refuses, naming the file, text that is not JSON and any other file hydraplan knows (a cost
    profile given as a plan, a plan given as a strategy pool, ...).
    """
    return parse_document(path, read_text(path), expected_kind)


def parse_document(path: str | Path, text: str, expected_kind: str) -> Any:
    """`read_document` of text already read from `path`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}: {exc.msg}"
        raise InputError(f"{path}: not {expected_kind.replace('a ', 'a valid ', 1)}: not valid JSON: {where}") from None
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
# Plan, pool, profile and catalog files
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


# ---------------------------------------------------------------------------------------------
# The batch and the planner's request types, built from flags
# ---------------------------------------------------------------------------------------------


def batch_lengths(args: argparse.Namespace) -> list[int]:
    """`--lengths FILE|-`, else a batch sampled from `--dataset`."""
    from hydraplan.api.datasets import load_lengths_file, sample_batch

    if getattr(args, "lengths", None):
        with naming_file(args.lengths), strict_utf8_stdin() if args.lengths == "-" else nullcontext():
            return load_lengths_file(args.lengths)
    return sample_batch(args.dataset, args.num_tokens, args.seed, args.context_cap)


def solver_options(args: argparse.Namespace, strategy_pool: list[str] | None = None) -> SolverOptions:
    """`SolverOptions` from the solver flags; a refused value names its flag."""
    from pydantic import ValidationError

    from hydraplan.planner.schemas import OversizePolicy, SolverBackend, SolverOptions

    try:
        return SolverOptions(
            solver=SolverBackend(args.solver),
            time_limit_s=args.time_limit_s,
            max_schemes=args.max_schemes,
            max_strategies_solved=args.max_strategies_solved,
            seed=args.seed,
            oversize=OversizePolicy(args.oversize),
            strategy_pool=strategy_pool,
        )
    except ValidationError as exc:
        raise InputError(describe_request_error(exc, args, ("options",))) from None


def plan_request(
    args: argparse.Namespace,
    lengths: list[int],
    options: SolverOptions,
    previous_strategy: str | None = None,
) -> PlanRequest:
    """`PlanRequest` from the batch, the cluster flags and the options; a refusal names its flag."""
    from pydantic import ValidationError

    from hydraplan.planner.schemas import PlanRequest

    try:
        return PlanRequest(
            lengths=lengths,
            num_gpus=args.num_gpus,
            gpus_per_node=args.gpus_per_node,
            options=options,
            previous_strategy=previous_strategy,
        )
    except ValidationError as exc:
        raise InputError(describe_request_error(exc, args)) from None


# ---------------------------------------------------------------------------------------------
# Validation errors -> flags
# ---------------------------------------------------------------------------------------------


def describe_request_error(
    exc: ValidationError, args: argparse.Namespace, location_prefix: tuple[str | int, ...] = ()
) -> str:
    """The first problem of a `PlanRequest`/`SolverOptions` validation, as the flag that caused it.

    The blamed field is the error's location (`num_gpus`, `options.time_limit_s`, `lengths[3]`)
    or, for a whole-model check, the first request field its message names. Field names in the
    message become flags: `--num-gpus 12: not a multiple of --gpus-per-node 8`.
    """
    errors = exc.errors()
    detail = errors[0]
    location = tuple(part for part in (*location_prefix, *detail["loc"]) if part != "options")
    raw_message = str(detail["msg"]).removeprefix("Value error, ")
    field = next((part for part in location if isinstance(part, str)), None) or _first_named_field(raw_message, args)
    message = _with_flags(raw_message, args)
    text = message
    if location[1:]:  # an element of a list field: keep its index, e.g. lengths[3]
        from hydraplan.cost_models.profile_io import format_location

        text = f"{format_location(location)}: {message}"
    others = len(errors) - 1
    more = f" (and {others} more problem{'s' if others > 1 else ''})" if others else ""
    flag = flag_of(field, args) if field else None
    if flag is None:
        return f"{format_location_or_request(location)}{text}{more}"
    return f"{flag[0]} {flag[1]}: {_without_lead(text, field, flag)}{more}"


@contextmanager
def naming_flags(args: argparse.Namespace, refusals: tuple[type[ValueError], ...] = ()) -> Iterator[None]:
    """A `PlanningError` (or one of `refusals`) whose message starts with a request field
    (`previous_strategy: ...`, `strategy_pool[0] ...`, `num_gpus 12 is ...`) is re-raised prefixed
    with that field's flag and value, as the validation errors of `describe_request_error` are."""
    from hydraplan.planner.errors import PlanningError

    try:
        yield
    except (PlanningError, *refusals) as exc:
        message = " ".join(str(exc).split())
        leading = re.match(r"[a-z][a-z0-9_]*", message)
        field = leading.group() if leading else None
        if field is None or field not in _flag_fields(args):
            raise
        flag = flag_of(field, args)
        assert flag is not None
        text = _without_lead(_with_flags(message, args), field, flag)
        raise InputError(f"{flag[0]} {flag[1]}: {text}") from None


def _without_lead(text: str, field: str, flag: tuple[str, str]) -> str:
    """The message without a repeat of what the prefix says: `--num-gpus 12 is not ...` ->
    `not ...`, `previous_strategy: ...` -> `...`; a message about the field (`lengths sum to`) stays."""
    with_value = f"{flag[0]} {flag[1]}"
    if text.startswith(with_value) and not re.match(r"[\w\[.-]", text[len(with_value) : len(with_value) + 1]):
        return re.sub(r"^[\s:,]*(is\s+)?", "", text[len(with_value) :]) or text
    for name in (flag[0], field):
        if text.startswith(f"{name}:"):
            return text[len(name) + 1 :].strip() or text
    return text


def format_location_or_request(location: tuple[str | int, ...]) -> str:
    """`field.path: ` for a field without a flag, `invalid request: ` for a whole-model check."""
    from hydraplan.cost_models.profile_io import format_location

    return f"{format_location(location)}: " if location else "invalid request: "


def flag_of(field: str, args: argparse.Namespace) -> tuple[str, str] | None:
    """The flag that sets request field `field`, and its value as typed; None when no flag does."""
    if field == "lengths" and not getattr(args, "lengths", None):
        return SAMPLED_LENGTHS_FLAG, _shown(getattr(args, "num_tokens", "?"))
    if field == "previous_strategy" and getattr(args, "previous_plan", None):
        return PREVIOUS_PLAN_FLAG, _shown(args.previous_plan)
    if not hasattr(args, field):
        return None
    return "--" + field.replace("_", "-"), _shown(getattr(args, field))


def _shown(value: Any) -> str:
    """A flag's value as typed in a shell (quoted when it has spaces or `<`)."""
    return shlex.quote(str(value))


def _flag_fields(args: argparse.Namespace) -> list[str]:
    """Request fields this command has a flag for, longest first (so a name inside another is safe)."""
    from hydraplan.planner.schemas import PlanRequest, SolverOptions

    names = set(PlanRequest.model_fields) | set(SolverOptions.model_fields)
    return sorted((name for name in names if flag_of(name, args) is not None), key=len, reverse=True)


def _field_pattern(field: str) -> re.Pattern[str]:
    """`field` as a word of a message, not inside an identifier, a flag or an index like `lengths[3]`."""
    return re.compile(rf"(?<![\w\-.]){re.escape(field)}(?![\w\[])")


def _with_flags(message: str, args: argparse.Namespace) -> str:
    """Field names of the message as flags; only snake_case ones (`seed`, `solver` and `lengths`
    are also plain words, so those stay as written)."""
    for field in _flag_fields(args):
        if "_" in field:
            name = flag_of(field, args)[0]  # type: ignore[index]
            message = _field_pattern(field).sub(lambda _, name=name: name, message)
    return message


def _first_named_field(message: str, args: argparse.Namespace) -> str | None:
    """The request field a whole-model message names first (before `_with_flags`)."""
    positions = []
    for field in _flag_fields(args):
        found = _field_pattern(field).search(message)
        if found:
            positions.append((found.start(), field))
    return min(positions)[1] if positions else None


# ---------------------------------------------------------------------------------------------
# The cost profile of the cluster
# ---------------------------------------------------------------------------------------------


def cluster_profile(args: argparse.Namespace) -> CostProfile:
    """The user's `--profile` file, else the analytic profile of `--model` on `--gpu`."""
    if getattr(args, "profile", None):
        from hydraplan.cost_models.analytic import AnalyticOptions

        if analytic_options(args) != AnalyticOptions():
            raise InputError(
                f"--profile {args.profile}: the recipe flags (--recompute, --sharding, ...) apply to the "
                "analytic profile of --model on --gpu, not to a profile file"
            )
        return read_profile(args.profile)
    return analytic_profile(args)


def analytic_profile(args: argparse.Namespace) -> CostProfile:
    """The analytic profile of `--model` on `--gpu` for `--num-gpus` / `--gpus-per-node`."""
    from hydraplan.cost_models.analytic import build_profile

    model = catalog_model(args.model, args.models_file)
    gpu = catalog_gpu(args.gpu, args.gpus_file)
    options = analytic_options(args)
    with naming_flags(args, (ValueError,)):  # its cluster checks name num_gpus, gpus_per_node
        return build_profile(model, gpu, args.num_gpus, args.gpus_per_node, options)


def analytic_options(args: argparse.Namespace):
    """`AnalyticOptions` of the recipe flags (`cli_args.add_recipe_options`); defaults when absent."""
    from hydraplan.api.cli_args import RECIPE_FLAGS
    from hydraplan.cost_models.analytic import AnalyticOptions
    from hydraplan.planner.schemas import TrainingRecipe

    given = {name: getattr(args, name) for name in RECIPE_FLAGS if getattr(args, name, None) is not None}
    return AnalyticOptions.from_recipe(TrainingRecipe(**given))
