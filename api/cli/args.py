"""Argument types and the option groups several `hydraplan` commands share.

Imported only once a command is chosen (never for `hydraplan --help`), so it may import the
planner's schema module for choices and defaults; the solver libraries stay unimported.
"""

from __future__ import annotations

import argparse
import os

from hydraplan.planner.schemas import OversizePolicy, SolverBackend, SolverOptions

CATALOG_FILE_HELP = (
    'JSON file of extra {kind}s: an object {{"{key}": [entry, ...]}}, each entry with the fields of '
    "`hydraplan {key} --json`; an entry named like a catalog one replaces it"
)


# ---------------------------------------------------------------------------------------------
# Argument types: a bad value is a usage error naming the flag (argparse adds it)
# ---------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """An integer >= 1 (underscores allowed: 1_000_000)."""
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


# local worker processes a command may start, per core this process may use: more only fork copies
# of the planner that wait for a core (100,000 asked of `plan --workers` forked until the machine hung)
PROCESSES_PER_CORE = 4


def usable_cores() -> int:
    """The cores this process may use (its CPU affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def process_limit_problem(count: int, what: str = "") -> str | None:
    """What is wrong with starting `count` local worker processes (`what` names them), None when
    nothing is: at most PROCESSES_PER_CORE per usable core."""
    cores = usable_cores()
    most = PROCESSES_PER_CORE * cores
    if count <= most:
        return None
    return f"at most {most}{' ' + what if what else ''} here ({PROCESSES_PER_CORE} per core, {cores} usable)"


def process_count(text: str) -> int:
    """A count of local worker processes: an integer from 1 to PROCESSES_PER_CORE per usable core."""
    value = positive_int(text)
    problem = process_limit_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} processes: {problem}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def integer(text: str) -> int:
    """Any integer, `_` separators allowed."""
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


AUTO_TIME_LIMIT = "auto"  # `SolverOptions.time_limit_s`: a share of the step (`planner.budget`)


def time_limit(text: str) -> float | str:
    """A planning-time budget: seconds > 0, or `auto` (the planner resolves it for the batch)."""
    if text.strip().lower() == AUTO_TIME_LIMIT:
        return AUTO_TIME_LIMIT
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of seconds nor auto") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0 (or auto)")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


# ---------------------------------------------------------------------------------------------
# Shared option groups
# ---------------------------------------------------------------------------------------------


def add_catalog_file_option(group: argparse._ActionsContainer, kind: str) -> None:
    """`--models-file` or `--gpus-file` (kind "model" or "GPU")."""
    key = "models" if kind == "model" else "gpus"
    group.add_argument(f"--{key}-file", metavar="FILE", help=CATALOG_FILE_HELP.format(kind=kind, key=key))


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """Options naming the model, the GPU and the cluster (plan, strategies, schemes, profile)."""
    group = parser.add_argument_group("model and cluster")
    group.add_argument(
        "--model", default="llama3-8b", help="catalog model, see `hydraplan models` (default: %(default)s)"
    )
    group.add_argument(
        "--gpu", default="h100-sxm-80gb", help="catalog GPU, see `hydraplan gpus` (default: %(default)s)"
    )
    group.add_argument(
        "--num-gpus",
        type=positive_int,
        metavar="N",
        default=64,
        help="GPUs in the cluster: fewer than --gpus-per-node (a part of one node), or a whole "
        "number of nodes (default: %(default)s)",
    )
    group.add_argument(
        "--gpus-per-node",
        type=positive_int,
        metavar="N",
        default=8,
        help="GPUs per node; tensor-parallel groups stay inside one (default: %(default)s)",
    )
    add_catalog_file_option(group, "model")
    add_catalog_file_option(group, "GPU")
    add_recipe_options(parser)


def fraction(text: str) -> float:
    """A number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [0, 1]")
    return value


RECIPE_FLAGS = (
    "recompute",
    "sharding",
    "grad_dtype",
    "grad_reduce_dtype",
    "optimizer_dtype",
    "dp_sync_exposed",
    "tp_comm_exposed",
    "cp_comm_exposed",
    "efficiency",
)


def add_recipe_options(parser: argparse.ArgumentParser) -> None:
    """The training recipe the analytic profile is built for (`TrainingRecipe`; issue 13)."""
    from hydraplan.planner.schemas import TrainingRecipe

    fields = TrainingRecipe.model_fields
    group = parser.add_argument_group("training recipe (the analytic profile of --model on --gpu)")
    for name in ("recompute", "sharding", "grad_dtype", "grad_reduce_dtype", "optimizer_dtype", "efficiency"):
        choices = fields[name].annotation.__args__  # type: ignore[union-attr]
        group.add_argument(
            "--" + name.replace("_", "-"),
            choices=choices,
            default=fields[name].default,
            help=f"{fields[name].description} (default: %(default)s)",
        )
    for name in ("dp_sync_exposed", "tp_comm_exposed", "cp_comm_exposed"):
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=fraction,
            metavar="FRACTION",
            default=fields[name].default,
            help=f"{fields[name].description} (default: %(default)s)",
        )


def add_virtual_stages_option(parser: argparse.ArgumentParser) -> None:
    """`--virtual-stages V [V ...]`: the analytic profile also prices the interleaved schemes."""
    parser.add_argument(
        "--virtual-stages",
        type=positive_int,
        nargs="+",
        default=[],
        metavar="V",
        help="also price each scheme with pp > 1 as <tp,pp,cp,V>: V model chunks per GPU under interleaved "
        "1F1B, where V divides the layers per stage and the schedule fits in memory (the analytic profile; the "
        "search then chooses between them and the plain schemes)",
    )


def add_profile_option(parser: argparse.ArgumentParser) -> None:
    """`--profile FILE`: a cost profile instead of the catalog's analytic one."""
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="cost profile JSON (hydraplan.profile/1) to use instead of --model/--gpu",
    )


def add_sampling_options(group: argparse._ActionsContainer, source: argparse._ActionsContainer) -> None:
    """`--dataset` (in `source`, exclusive with `--lengths` where there is one), tokens and cap."""
    from hydraplan.api.datasets import DATASET_DESCRIPTIONS, DATASETS

    source.add_argument(
        "--dataset",
        choices=list(DATASETS),
        default="wikipedia",
        help="sample the batch from a bundled dataset (default: %(default)s): "
        + "; ".join(f"{name}: {text}" for name, text in DATASET_DESCRIPTIONS.items()).replace("%", "%%"),
    )
    group.add_argument(
        "--num-tokens",
        type=positive_int,
        metavar="N",
        default=1_000_000,
        help="tokens to sample from --dataset (default: %(default)s)",
    )
    group.add_argument(
        "--context-cap",
        type=positive_int,
        metavar="TOKENS",
        default=32768,
        help="split sampled documents longer than this into chunks (default: %(default)s)",
    )


def add_solver_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The `SolverOptions` flags; returns the group so a command can add its own to it."""
    solver = parser.add_argument_group("solver")
    solver.add_argument(
        "--seed",
        type=non_negative_int,
        metavar="N",
        default=0,
        help="seed for sampling and solving (default: %(default)s)",
    )
    solver.add_argument(
        "--max-schemes",
        type=positive_int,
        metavar="K",
        default=3,
        help="most distinct schemes in a strategy (default: %(default)s)",
    )
    solver.add_argument(
        "--time-limit-s",
        type=time_limit,
        metavar="SECONDS|auto",
        default=2.0,
        help="planning-time budget in seconds, or auto: half of the batch's step-time floor, clipped to "
        "[0.5, 60] s (default: %(default)s)",
    )
    solver.add_argument(
        "--max-strategies-solved",
        type=positive_int,
        metavar="N",
        default=SolverOptions().max_strategies_solved,
        help="deterministic work limit: most strategies fully solved (default: %(default)s)",
    )
    solver.add_argument(
        "--solver",
        choices=[backend.value for backend in SolverBackend],
        default=SolverBackend.AUTO.value,
        help="solver backend; auto runs them as an anytime pipeline (default: %(default)s)",
    )
    solver.add_argument(
        "--oversize",
        choices=[policy.value for policy in OversizePolicy],
        default="error",
        help="sequences longer than every capacity: fail, split into chunks, or drop (default: %(default)s)",
    )
    return solver


def add_progress_option(group: argparse._ActionsContainer) -> None:
    """`--progress` / `--no-progress`: progress lines on standard error."""
    group.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress lines on standard error (never on standard output); default: shown when "
        "standard error is a terminal and the command is expected to take 2 s or more",
    )


def add_json_option(group: argparse._ActionsContainer, help_text: str) -> None:
    """`--json`: machine-readable standard output."""
    group.add_argument("--json", action="store_true", help=help_text)
