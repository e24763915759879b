"""The planner types the `hydraplan` command line builds from its flags: the batch,
`SolverOptions`, `PlanRequest` and the cluster's cost profile (files are read by `api.files`).

Every failure is an `InputError` (a `ValueError`) whose one-line message names the flag:
`--num-gpus 12: not a multiple of --gpus-per-node 8`. The planner's own validators stay the single
source of the rules; `describe_request_error` only translates their field names into flags, so a
validator added to `PlanRequest` or `SolverOptions` gets a CLI message for free.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from hydraplan.api.files import InputError, catalog_gpu, catalog_model, naming_file, read_profile, strict_utf8_stdin

if TYPE_CHECKING:  # the CLI imports pydantic and the planner only inside its commands
    from pydantic import ValidationError

    from hydraplan.planner.schemas import CostProfile, PlanRequest, SolverOptions

# request fields whose value comes from another flag than `--<field-name>`
SAMPLED_LENGTHS_FLAG = "--num-tokens"
PREVIOUS_PLAN_FLAG = "--previous-plan"


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
            rank_slowdowns=parse_rank_slowdowns(getattr(args, "rank_slowdowns", None)),
        )
    except ValidationError as exc:
        raise InputError(describe_request_error(exc, args)) from None


def parse_rank_slowdowns(text: str | None) -> dict[int, float] | None:
    """`--rank-slowdowns 3=2.5,7=1.5` as {rank: factor}; InputError naming a malformed pair (the
    ranks and factors themselves are checked by `PlanRequest`)."""
    if text is None:
        return None
    factors: dict[int, float] = {}
    for pair in text.split(","):
        match = re.fullmatch(r"\s*(\d{1,9})\s*=\s*([^,=\s]{1,40})\s*", pair)
        try:
            factor = float(match.group(2)) if match else None
        except ValueError:
            factor = None
        if match is None or factor is None:
            raise InputError(f"--rank-slowdowns {_shown(text)}: {pair.strip()[:60]!r} is not RANK=FACTOR")
        rank = int(match.group(1))
        if rank in factors:
            raise InputError(f"--rank-slowdowns {_shown(text)}: rank {rank} is given twice")
        factors[rank] = factor
    return factors


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
    errors = _without_union_members(exc.errors())
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


# the tag pydantic puts in an error's location for the union member that refused the value
UNION_MEMBER_TAG = re.compile(r"constrained-\w+|literal\[.*\]|function-[a-z]+\[.*\]")


def _without_union_members(errors: list[Any]) -> list[Any]:
    """One error per field: a value refused by each member of a union (`time_limit_s`: a number
    in range, or 'auto') is reported by the first member, without the member's tag in its location."""
    kept: dict[tuple, Any] = {}
    for error in errors:
        location = tuple(
            part for part in error["loc"] if not (isinstance(part, str) and UNION_MEMBER_TAG.fullmatch(part))
        )
        kept.setdefault(location, {**error, "loc": location})
    return list(kept.values())


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


def cluster_profile(args: argparse.Namespace, virtual_stages: Sequence[int] = ()) -> CostProfile:
    """The user's `--profile` file, else the analytic profile of `--model` on `--gpu` (pricing the
    interleaved schemes of `virtual_stages` and `--virtual-stages` too)."""
    if getattr(args, "profile", None):
        from hydraplan.cost_models.analytic import AnalyticOptions

        if analytic_options(args) != AnalyticOptions():
            raise InputError(
                f"--profile {args.profile}: the recipe flags (--recompute, --sharding, ...) apply to the "
                "analytic profile of --model on --gpu, not to a profile file"
            )
        if getattr(args, "virtual_stages", None):
            raise InputError(
                f"--profile {args.profile}: --virtual-stages {args.virtual_stages[0]} applies to the analytic "
                "profile of --model on --gpu; a profile file prices interleaved schemes in its own entries (v)"
            )
        return read_profile(args.profile)
    return analytic_profile(args, virtual_stages)


def analytic_profile(args: argparse.Namespace, virtual_stages: Sequence[int] = ()) -> CostProfile:
    """The analytic profile of `--model` on `--gpu` for `--num-gpus` / `--gpus-per-node`, with the
    interleaved schemes of `virtual_stages` and `--virtual-stages` (when the command has it)."""
    from hydraplan.cost_models.analytic import build_profile

    model = catalog_model(args.model, args.models_file)
    gpu = catalog_gpu(args.gpu, args.gpus_file)
    options = analytic_options(args)
    chunks = sorted({*virtual_stages, *getattr(args, "virtual_stages", [])} - {1})
    with naming_flags(args, (ValueError,)):  # its cluster checks name num_gpus, gpus_per_node
        return build_profile(model, gpu, args.num_gpus, args.gpus_per_node, options, virtual_stages=chunks)


def analytic_options(args: argparse.Namespace):
    """`AnalyticOptions` of the recipe flags (`api.cli.args.add_recipe_options`); defaults when absent."""
    from hydraplan.api.cli.args import RECIPE_FLAGS
    from hydraplan.cost_models.analytic import AnalyticOptions
    from hydraplan.planner.schemas import TrainingRecipe

    given = {name: getattr(args, name) for name in RECIPE_FLAGS if getattr(args, name, None) is not None}
    return AnalyticOptions.from_recipe(TrainingRecipe(**given))
