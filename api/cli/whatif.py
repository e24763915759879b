"""`hydraplan whatif`: sweep clusters, models, data and planners; answer capacity questions.

Axes are comma lists (`--num-gpus 16,32,64 --gpu h100-sxm-80gb,h200-141gb`), or come from a
`--spec` file (YAML, TOML or JSON with the keys of `api.whatif.spec.SweepSpec`); flags replace the
file's values. Every bad input is one line and exit 2 before any work. Rows are appended to
`--out DIR/rows.jsonl` as they finish: an interrupted sweep (exit 130) keeps them, and `--resume`
computes only the rest. The tables, figures and report are written when the sweep completes.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from hydraplan.api.cli.args import (
    PROCESSES_PER_CORE,
    add_catalog_file_option,
    add_json_option,
    add_progress_option,
    positive_int,
    process_limit_problem,
    usable_cores,
)
from hydraplan.api.cli.interrupts import INTERRUPTS, is_interrupt
from hydraplan.api.cli.progress import PROG, stderr_is_terminal
from hydraplan.api.files import InputError

EXIT_OK, EXIT_INTERRUPTED = 0, 130
MATPLOTLIB_MISSING = "the figures need matplotlib: pip install 'hydraplan[whatif]'"
JINJA2_MISSING = "the HTML report needs jinja2: pip install 'hydraplan[whatif]'"
EXECUTORS = ("local", "ray", "inline")


# ---------------------------------------------------------------------------------------------
# Flags -> spec values: the axes' comma lists as typed (`SweepSpec` parses them as it parses a
# spec file's, so `32k`, `1M` and `64,,128` mean the same in both); the rest parsed here, so a bad
# value is one line naming the flag
# ---------------------------------------------------------------------------------------------


def _number(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{flag} {text!r}: not a number") from None
    if not 0 < value < float("inf"):
        raise InputError(f"{flag} {text!r}: must be > 0")
    return value


def _time_limit(text: str) -> float | str:
    """`--time-limit-s`: seconds, or auto (a share of each step, as for `hydraplan plan`)."""
    from hydraplan.api.cli.args import AUTO_TIME_LIMIT

    return AUTO_TIME_LIMIT if text.strip().lower() == AUTO_TIME_LIMIT else _number("--time-limit-s", text)


def _compare(text: str | None) -> str | list[str] | None:
    """`--compare all`, `none`, or a comma list of baselines."""
    if text is None or text == "all":
        return None  # the spec's default: every baseline
    return [] if text == "none" else text


def parse_prices(text: str | None) -> dict[str, float] | None:
    """`--price-per-gpu-hour 2.5` (every GPU type) or `h100-sxm-80gb=2.5,h200-141gb=3.6`."""
    if text is None:
        return None
    if "=" not in text:
        return {"*": _number("--price-per-gpu-hour", text.strip())}
    from hydraplan.api.whatif.spec import comma_list

    prices = {}
    try:
        parts = comma_list(text)
    except ValueError as exc:
        raise InputError(f"--price-per-gpu-hour {exc}") from None
    for part in parts:
        name, separator, value = part.partition("=")
        if not separator or not name.strip():
            raise InputError(f"--price-per-gpu-hour {part!r}: expected GPU=PRICE, e.g. h100-sxm-80gb=2.5")
        prices[name.strip()] = _number("--price-per-gpu-hour", value.strip())
    return prices


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The spec keys set on the command line (None: not given)."""
    return {
        "models": args.model,
        "gpus": args.gpu,
        "num_gpus": args.num_gpus,
        "gpus_per_node": args.gpus_per_node,
        "context_caps": args.context_cap,
        "datasets": args.dataset,
        "tokens_per_step": args.tokens_per_step,
        "cost_sources": args.cost_source,
        "planners": args.planner,
        "compare": _compare(args.compare),
        "seeds": args.seeds,
        "seed": args.seed,
        "time_limit_s": None if args.time_limit_s is None else _time_limit(args.time_limit_s),
        "max_schemes": args.max_schemes,
        "max_strategies_solved": args.max_strategies_solved,
        "oversize": args.oversize,
        "price_per_gpu_hour": parse_prices(args.price_per_gpu_hour),
        "target_tokens_per_s": None
        if args.target_tokens_per_s is None
        else _number("--target-tokens-per-s", args.target_tokens_per_s),
        "budget_per_hour": None if args.budget_per_hour is None else _number("--budget-per-hour", args.budget_per_hour),
        "models_file": args.models_file,
        "gpus_file": args.gpus_file,
    }


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def run_whatif(args: argparse.Namespace) -> int:
    """Check everything, run the unfinished configurations, then write tables, figures and report."""
    from hydraplan.api.whatif.executors import make_executor
    from hydraplan.api.whatif.progress import SweepProgress
    from hydraplan.api.whatif.results import ROWS_FILE, RowsFile, read_rows
    from hydraplan.api.whatif.spec import build_spec, expand, read_spec_file
    from hydraplan.api.whatif.sweep import publish, run_sweep

    if not args.no_plots and importlib.util.find_spec("matplotlib") is None:
        raise InputError(f"{MATPLOTLIB_MISSING} (or add --no-plots)")
    if importlib.util.find_spec("jinja2") is None:  # refused before the sweep, not after it
        raise InputError(JINJA2_MISSING)
    file_values = read_spec_file(args.spec) if args.spec else {}
    spec, where = build_spec(file_values, flag_values(args), args.spec)
    configurations = expand(spec, where, args.max_configurations, args.yes)
    workers = args.workers or usable_cores()
    problem = process_limit_problem(workers, "local processes") if args.executor == "local" else None
    if problem is not None:
        raise InputError(f"--workers {workers}: {problem}; a Ray cluster takes more (--executor ray)")
    executor = make_executor(args.executor, workers, args.ray_address)
    folder = Path(args.out)
    rows_file = RowsFile(folder, configurations, args.resume)
    finished = len(rows_file.finished)
    if args.resume:
        print(
            f"{PROG}: resuming {folder}: {finished} of {len(configurations)} rows finished, "
            f"computing {len(configurations) - finished}",
            file=sys.stderr,
        )
    progress = SweepProgress(len(configurations), finished, _progress_enabled(args.progress))
    try:
        rows = run_sweep(configurations, executor, rows_file, progress)
    except INTERRUPTS as exc:
        if not is_interrupt(exc):
            raise
        kept = len(read_rows(folder / ROWS_FILE, set(rows_file.keys)))  # what a --resume will find
        print(
            f"{PROG}: interrupted: {kept} of {len(configurations)} rows kept in {folder / 'rows.jsonl'}; "
            "rerun with --resume to compute the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    publication = publish(folder, spec, configurations, rows, spec.model_dump_json(indent=2), plots=not args.no_plots)
    _print(publication, args.json)
    print(
        f"{PROG}: wrote {len(publication.files)} files to {folder} (report: {folder / 'report.html'})", file=sys.stderr
    )
    return EXIT_OK


def _progress_enabled(requested: bool | None) -> bool:
    return stderr_is_terminal() if requested is None else requested


def _print(publication: Any, as_json: bool) -> None:
    from hydraplan.api.whatif.results import JSON_FILE

    if as_json:
        folder = publication.files[0].parent
        print((folder / JSON_FILE).read_text(encoding="utf-8"), end="")
        return
    print(render_rows(publication.rows))
    for answer in publication.answers:
        print(f"{answer.question}: {answer.text}")


def render_rows(rows: list) -> str:
    """The rows as a text table: configuration, throughput, step time, cost, gap or reason."""
    header = f"{'#':>3}  {'model':<12} {'gpu':<14} {'GPUs':>5} {'dataset':<12} {'cap':>7} {'planner':<10} "
    header += f"{'tokens/s':>12} {'step s':>9} {'MFU':>6} {'$/1M':>8}  strategy / reason"
    lines = [header]
    for row in rows:
        cap = "none" if row.context_cap is None else str(row.context_cap)
        head = f"{row.index:>3}  {str(row.model):<12.12} {str(row.gpu):<14.14} {row.num_gpus:>5} "
        head += f"{row.dataset:<12.12} {cap:>7} {row.planner:<10.10} "
        if row.reason:
            lines.append(head + f"{'-':>12} {'-':>9} {'-':>6} {'-':>8}  could not plan: {row.reason}")
            continue
        cost = "-" if row.cost_per_1m_tokens is None else f"{row.cost_per_1m_tokens:.3g}"
        mfu = "-" if row.mfu is None else f"{row.mfu:.1%}"
        lines.append(head + f"{row.tokens_per_s:>12,.0f} {row.step_time_s:>9.3f} {mfu:>6} {cost:>8}  {row.strategy}")
    return "\n".join(lines)


def add_whatif_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan whatif`."""
    parser.description = (
        "Sweep models, GPU types, cluster sizes, context caps, datasets, tokens per step, cost sources and "
        "planners (comma lists, or a --spec file); each configuration plans --seeds steps. Writes rows.csv, "
        "rows.json, memory.csv, plots/*.png|svg and report.html into --out."
    )
    parser.add_argument("--spec", metavar="FILE", help="sweep spec: YAML, TOML or JSON with the keys of the flags")
    axes = parser.add_argument_group("axes (comma lists; each replaces the spec file's value)")
    axes.add_argument("--model", metavar="NAMES", help="catalog models (default: llama3-8b)")
    axes.add_argument("--gpu", metavar="NAMES", help="catalog GPU types (default: h100-sxm-80gb)")
    axes.add_argument("--num-gpus", metavar="COUNTS", help="cluster sizes (default: 64)")
    axes.add_argument("--gpus-per-node", metavar="COUNTS", help="GPUs per node (default: 8)")
    axes.add_argument(
        "--context-cap", metavar="TOKENS", help="split documents longer than this; none: never (default: 32768)"
    )
    axes.add_argument(
        "--dataset",
        metavar="NAMES",
        help="bundled datasets (wikipedia, lognormal, sft-mix, longalign), lengths:FILE (documents drawn from "
        "the file's lengths) or batch:FILE (the file is every step's exact batch) (default: wikipedia)",
    )
    axes.add_argument("--tokens-per-step", metavar="TOKENS", help="tokens per step, e.g. 1M,2M (default: 1000000)")
    axes.add_argument(
        "--cost-source",
        metavar="SOURCES",
        help="analytic, or profile:FILE (a measured or calibrated profile) (default: analytic)",
    )
    axes.add_argument(
        "--planner",
        metavar="NAMES",
        help="hydraplan, hydraplan:BACKEND (auto, greedy, lp, cpsat, pulp), or a baseline planning alone "
        "(megatron, wlb, flexsp, hydraulis) (default: hydraplan)",
    )
    add_catalog_file_option(axes, "model")
    add_catalog_file_option(axes, "GPU")
    steps = parser.add_argument_group("steps and solver")
    steps.add_argument("--seeds", type=positive_int, metavar="N", help="seeded steps per configuration (default: 3)")
    steps.add_argument("--seed", type=int, metavar="N", help="seed of the first step (default: 0)")
    steps.add_argument(
        "--time-limit-s", metavar="SECONDS|auto", help="planner budget per step, or auto (default: 0.5)"
    )
    steps.add_argument(
        "--max-schemes", type=positive_int, metavar="K", help="most distinct schemes per strategy (default: 3)"
    )
    steps.add_argument(
        "--max-strategies-solved",
        type=positive_int,
        metavar="N",
        help="deterministic work limit per step (default: 16)",
    )
    steps.add_argument("--oversize", choices=["error", "split", "drop"], help="sequences longer than every capacity")
    steps.add_argument(
        "--compare",
        metavar="NAMES",
        help="baselines for the speedup columns: all, none, or a comma list (default: all)",
    )
    questions = parser.add_argument_group("costs and questions")
    questions.add_argument(
        "--price-per-gpu-hour",
        metavar="PRICES",
        help="GPU=PRICE comma list (or one PRICE for every type); needed for every swept GPU type once given",
    )
    questions.add_argument(
        "--target-tokens-per-s", metavar="X", help="report the smallest cluster per GPU type reaching X"
    )
    questions.add_argument(
        "--budget-per-hour", metavar="Y", help="report the fastest configuration costing <= Y per hour"
    )
    run = parser.add_argument_group("running")
    run.add_argument("--out", metavar="DIR", default="whatif-results", help="results folder (default: %(default)s)")
    run.add_argument("--resume", action="store_true", help="continue the sweep in --out: compute only missing rows")
    run.add_argument("--executor", choices=EXECUTORS, default="local", help="local process pool, Ray, or this process")
    run.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help=f"worker processes (default: the cores this process may use; 1 runs in this process; local: at "
        f"most {PROCESSES_PER_CORE} per core)",
    )
    run.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster (HOST:PORT, ray://HOST:PORT, auto); default: a local instance",
    )
    run.add_argument(
        "--max-configurations",
        type=positive_int,
        metavar="N",
        default=100,
        help="refuse larger sweeps without --yes (default: %(default)s)",
    )
    run.add_argument("--yes", action="store_true", help="run a sweep over --max-configurations")
    run.add_argument("--no-plots", action="store_true", help="write the tables and report without figures")
    add_json_option(run, "print the rows JSON (rows.json) instead of the text table")
    add_progress_option(run)
    parser.set_defaults(handler=run_whatif)


ADD_ARGUMENTS = {"whatif": add_whatif_arguments}
