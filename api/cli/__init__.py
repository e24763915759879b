"""The `hydraplan` command line: plan a batch, check a plan, list schemes and catalogs, write a
profile, serve.

Every flag maps onto the planner's own types (`PlanRequest`, `SolverOptions`, `CostProfile`).
User mistakes print one line `hydraplan: error: ...` on stderr and exit 2; `check` exits 1 for a
plan that violates a constraint.

This module imports only the standard library: each command's flags and code live in
`api.cli.plan` / `api.cli.inspect` and are imported once that command is chosen, so `hydraplan
--help` never loads pydantic, numpy or a solver. FastAPI is imported only by `serve`.

The package, one module per command and the few they share:

- `plan` (plan, strategies), `inspect` (check, show, schemes, profile, models, gpus, schema),
  `profile` (`profile --device` and `--calibrate`), `whatif`, `run` (with `run_online` and the
  step planners of `run_planning`), `data` (with `tokenizers`);
- `args` (argument types, shared option groups), `inputs` (the planner types built from flags),
  `progress` (progress lines on stderr), `timeline` (`--timeline` of plan and show).

`python -m hydraplan.api.cli` runs `main` (`__main__.py`). The command line is the top of `api`:
it may import every other part of it (files, datasets, render, whatif, client), the service only
inside `serve`, and nothing else in `api` imports it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn

PROG = "hydraplan"
EXIT_OK, EXIT_INVALID_PLAN, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a killed writer
EXIT_INTERRUPTED = 130  # 128 + SIGINT
SERVICE_MISSING = "the service extra is not installed: pip install 'hydraplan[service]'"
MAX_ERROR_CHARS = 600  # an error line longer than this (e.g. a binary file's bytes) is cut


class Command(NamedTuple):
    """A subcommand: the module that adds its flags, and its line in `hydraplan --help`."""

    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "plan": Command(
        "hydraplan.api.cli.plan", "plan one global batch (default: ~1M Wikipedia tokens, llama3-8b on 64 H100)"
    ),
    "strategies": Command(
        "hydraplan.api.cli.plan", "propose a small pool of strategies for batches drawn from a dataset"
    ),
    "check": Command("hydraplan.api.cli.inspect", "check a plan JSON file (exit 0 valid, 1 violations, 2 unreadable)"),
    "show": Command("hydraplan.api.cli.inspect", "print a saved plan's summary; --timeline draws its 1F1B schedule"),
    "schemes": Command(
        "hydraplan.api.cli.inspect", "list runnable schemes with their cost coefficients and capacities"
    ),
    "profile": Command("hydraplan.api.cli.inspect", "write a cost profile JSON (hydraplan.profile/1)"),
    "models": Command("hydraplan.api.cli.inspect", "list the catalog models (--model, --models-file)"),
    "gpus": Command("hydraplan.api.cli.inspect", "list the catalog GPUs (--gpu, --gpus-file)"),
    "schema": Command("hydraplan.api.cli.inspect", "print the JSON Schema of a format: plan, profile, request, pool"),
    "whatif": Command(
        "hydraplan.api.cli.whatif", "what-if capacity study: sweep clusters, models, data; plots and a report"
    ),
    "serve": Command(__name__, "run the REST service (needs the service extra)"),
    "run": Command("hydraplan.api.cli.run", "execute a plan on local torch ranks (needs the runtime extra)"),
    "data": Command("hydraplan.api.cli.data", "convert a corpus to pre-tokenised documents; a batch's lengths"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default `sys.argv[1:]`); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return args.handler(args)
    except BrokenPipeError:  # e.g. `hydraplan plan --json | head`: the reader has gone
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        return _fail(describe_os_error(exc))
    except ValueError as exc:  # InputError, PlanningError, CatalogError, ProfileError, ValidationError
        return _fail(describe_value_error(exc))
    except (KeyboardInterrupt, SystemError) as exc:  # Ctrl-C, also as an extension's SystemError
        from hydraplan.api.cli.interrupts import is_interrupt  # not at import: `--help` loads nothing more

        if not is_interrupt(exc):
            raise
        return EXIT_INTERRUPTED


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _fail(message: str) -> int:
    print(error_line(message), file=sys.stderr)
    return EXIT_USAGE


def error_line(message: str) -> str:
    """`hydraplan: error: MESSAGE` on one line, cut at `MAX_ERROR_CHARS`."""
    one_line = " ".join(message.split())
    if len(one_line) > MAX_ERROR_CHARS:
        one_line = one_line[: MAX_ERROR_CHARS - 4] + " ..."
    return f"{PROG}: error: {one_line}"


def describe_value_error(exc: ValueError) -> str:
    """The message of a refusal; a pydantic error no command translated names its model."""
    if type(exc).__name__ == "ValidationError" and "pydantic" in sys.modules:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            from hydraplan.api.files import first_problem

            return f"invalid {exc.title}: {first_problem(exc)}"
    return str(exc)


def describe_os_error(exc: OSError) -> str:
    """`FILE: No such file or directory` when the error names a file."""
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


# ---------------------------------------------------------------------------------------------
# serve (here: it needs none of the planner's flags)
# ---------------------------------------------------------------------------------------------


def run_serve(args: argparse.Namespace) -> int:
    """`hydraplan serve`: the REST service (imported here so the CLI never needs FastAPI)."""
    try:
        from hydraplan.api.service.server import run
    except ImportError as exc:
        raise ValueError(f"{SERVICE_MISSING} ({exc})") from None
    run(args.host, args.port, args.workers, args.root_path)
    return EXIT_OK


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan serve`."""
    from hydraplan.api.cli.args import PROCESSES_PER_CORE, positive_int, process_count

    parser.description = "Run the REST service (pip install 'hydraplan[service]')."
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    parser.add_argument("--port", type=positive_int, default=8000, help="port (default: %(default)s)")
    parser.add_argument(
        "--workers",
        type=process_count,
        metavar="N",
        default=1,
        help=f"worker processes (default: %(default)s; at most {PROCESSES_PER_CORE} per core)",
    )
    parser.add_argument(
        "--root-path",
        default="",
        metavar="PREFIX",
        help="path prefix a proxy strips before forwarding, e.g. /api (links and docs use it; the token is "
        "required on every path but the operations ones either way)",
    )
    parser.set_defaults(handler=run_serve)


ADD_ARGUMENTS = {"serve": add_serve_arguments}


# ---------------------------------------------------------------------------------------------
# Parser: each command's flags are added only when that command is chosen
# ---------------------------------------------------------------------------------------------


class _LazyCommands(argparse._SubParsersAction):
    """Subcommands whose flags are added when the command is chosen (argparse calls this action
    with the command name), so `hydraplan --help` imports no command module."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string=None):
        name = values[0]
        if name in COMMANDS and name in self._name_parser_map:
            add_command_arguments(name, self._name_parser_map[name])
        super().__call__(parser, namespace, values, option_string)


def add_command_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Add command `name`'s flags to its (still empty) parser, once."""
    if getattr(parser, "_hydraplan_populated", False):
        return
    module = importlib.import_module(COMMANDS[name].module)
    module.ADD_ARGUMENTS[name](parser)
    parser._hydraplan_populated = True  # type: ignore[attr-defined]


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors (a value its `type=` refuses, an unknown flag, a missing
    argument) are one line, `hydraplan: error: argument --num-gpus: '0' must be >= 1`, and exit 2
    like every other refusal; `--help` shows the usage. Subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, error_line(message) + "\n")


class _Version(argparse.Action):
    """`--version`, read from the installed metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string=None):
        print(f"{parser.prog} {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The `hydraplan` parser; the subcommands get their flags when chosen (`_LazyCommands`)."""
    parser = _Parser(
        prog=PROG,
        description="Plan Transformer training steps on variable-length data with heterogeneous <TP,PP,CP> pipelines.",
    )
    parser.add_argument("--version", action=_Version, help="show program's version number and exit")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True, action=_LazyCommands)
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.help)
    return parser


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("hydraplan")
    except metadata.PackageNotFoundError:
        return "unknown"
