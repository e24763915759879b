"""`hydraplan check`, `schemes`, `profile`, `models`, `gpus` and `schema`: commands that read or
write files, catalogs and formats without planning."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydraplan.api.cli.args import (
    add_catalog_file_option,
    add_cluster_options,
    add_json_option,
    add_profile_option,
    add_progress_option,
    add_virtual_stages_option,
    positive_float,
    positive_int,
)
from hydraplan.api.cli.inputs import analytic_profile, cluster_profile
from hydraplan.api.cli.progress import PROG
from hydraplan.api.files import InputError, read_gpus, read_models, read_plan, read_profile, read_request
from hydraplan.api.render.tables import print_table

EXIT_OK, EXIT_INVALID_PLAN = 0, 1


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------


def run_check(args: argparse.Namespace) -> int:
    """0 when the plan is valid, 1 listing violations, 2 (an `InputError`) if unreadable. With
    `--bound`, the plan's lower bound must also verify from its certificate."""
    from hydraplan.planner.check import check_plan

    if args.bound and not args.profile:
        raise InputError("--bound needs --profile: the whole profile the plan was made with defines its strategy space")
    plan = read_plan(args.plan)
    profile = read_profile(args.profile) if args.profile else None
    request = read_request(args.request) if args.request else None
    violations = check_plan(plan, profile, request)
    verification = None
    if args.bound and not violations:  # the verifier reads the items of a valid plan
        from hydraplan.planner.verify_bound import verify_bound

        verification = verify_bound(plan, profile, request)
        violations = verification.violations
    if violations:
        print(f"plan INVALID: {args.plan}: {len(violations)} violation(s)")
        for violation in violations:
            print(f"  - {violation}")
        if verification is not None:
            print(_verified_line(verification))
        return EXIT_INVALID_PLAN
    print(
        f"plan OK: {args.plan}: {plan.strategy}, {len(plan.input_lengths)} sequences on "
        f"{plan.num_gpus} GPUs, step time {plan.step_time_s * 1e3:,.1f} ms"
    )
    if verification is not None:
        print(_verified_line(verification))
    return EXIT_OK


def _verified_line(verification) -> str:
    return (
        f"bound: claimed {verification.claimed_bound_s * 1e3:,.3f} ms, "
        f"verified {verification.verified_bound_s * 1e3:,.3f} ms "
        f"({verification.num_sets} scheme sets, {verification.num_expanded_sets} expanded, "
        f"{verification.num_strategies} strategies bounded one by one)"
    )


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `hydraplan check`."""
    parser.description = (
        "Check a plan independently: every sequence placed once, capacities, ranks and nodes, recomputed "
        "step time, status, plan_id. Exit 0 when valid, 1 listing violations, 2 when unreadable (or not a plan)."
    )
    parser.add_argument("plan", metavar="PLAN.json", help="plan written by `hydraplan plan --out`")
    parser.add_argument("--profile", metavar="FILE", help="re-check costs against this profile (default: the plan's)")
    parser.add_argument(
        "--request",
        metavar="FILE",
        help="the plan must answer this request (JSON, `hydraplan schema request`): its lengths, cluster, previous "
        "strategy and gap tolerance; with --profile (the profile it was planned with) also its request_hash",
    )
    parser.add_argument(
        "--bound",
        action="store_true",
        help="also verify lower_bound_s from the plan's bound certificate with the independent verifier (needs "
        "--profile, the whole profile the plan was made with; --request gives the strategy space's max_schemes)",
    )
    parser.set_defaults(handler=run_check)


# ---------------------------------------------------------------------------------------------
# show: a saved plan's summary and timeline
# ---------------------------------------------------------------------------------------------


def run_show(args: argparse.Namespace) -> int:
    """Print the summary of a saved plan; draw its timeline (and other plans') with --timeline."""
    from hydraplan.api.cli.timeline import timeline_format, write_timeline
    from hydraplan.api.render.plan_text import render_plan

    timeline_format(args.timeline)
    plan = read_plan(args.plan)
    others = [(Path(path).stem, read_plan(path)) for path in args.compare_with]
    print(render_plan(plan, args.pipelines), end="")
    if others:
        rows = [
            [label, other.strategy, f"{other.step_time_s * 1e3:,.3f}", f"{other.step_time_s / plan.step_time_s:.2f}x"]
            for label, other in others
        ]
        print()
        print_table(["compared plan", "strategy", "step time (ms)", "speedup of this plan"], rows)
    if args.timeline:
        drawn = [(Path(args.plan).stem, plan), *others]
        print(write_timeline(args.timeline, drawn, args.pipelines, [True] + [False] * len(others)), file=sys.stderr)
    return EXIT_OK


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan show`."""
    from hydraplan.api.cli.timeline import add_timeline_options

    parser.description = "Print the summary of a saved plan and, with --timeline, draw its 1F1B schedule."
    parser.add_argument("plan", metavar="PLAN.json", help="plan written by `hydraplan plan --out`")
    parser.add_argument(
        "--compare-with",
        metavar="FILE",
        action="append",
        default=[],
        help="another plan of the same batch (e.g. `hydraplan plan --baseline megatron --out m.json`) to compare "
        "and draw on the same time axis, labelled by its file name; repeatable",
    )
    add_timeline_options(parser)
    parser.set_defaults(handler=run_show)


# ---------------------------------------------------------------------------------------------
# schemes and profile
# ---------------------------------------------------------------------------------------------


def run_schemes(args: argparse.Namespace) -> int:
    """The table of runnable schemes and their costs."""
    from hydraplan.api.render.schemes import print_schemes

    print_schemes(cluster_profile(args))
    return EXIT_OK


def add_schemes_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan schemes`."""
    parser.description = (
        "List the runnable <TP,PP,CP> schemes: stage-time coefficients a, b, c (seconds) and capacity in tokens; "
        "<TP,PP,CP,V> for interleaved ones (V model chunks per GPU; a, b, c of a rank's V chunks)."
    )
    add_cluster_options(parser)
    add_profile_option(parser)
    add_virtual_stages_option(parser)
    parser.set_defaults(handler=run_schemes)


def run_profile(args: argparse.Namespace) -> int:
    """Write (or print) the analytic cost profile as JSON; `--device` measures one, `--calibrate`
    calibrates one (`api.cli.profile`)."""
    from hydraplan.cost_models.profile_io import save_profile

    if args.device is not None or args.calibrate is not None:
        from hydraplan.api.cli.inputs import analytic_options
        from hydraplan.api.cli.profile import run_calibrate, run_device_profile
        from hydraplan.api.files import InputError
        from hydraplan.cost_models.analytic import AnalyticOptions

        if analytic_options(args) != AnalyticOptions():
            raise InputError(
                "the recipe flags (--recompute, --sharding, ...) apply to --analytic profiles only; "
                "--device measures and --calibrate fits the default recipe"
            )
        if args.virtual_stages:
            raise InputError(f"--virtual-stages {args.virtual_stages[0]}: applies to --analytic profiles only")

        return run_device_profile(args) if args.device is not None else run_calibrate(args)

    profile = analytic_profile(args)
    if args.out:
        save_profile(profile, args.out)
        print(
            f"{PROG}: wrote {profile.source} profile of {len(profile.schemes)} schemes "
            f"({profile.model} on {profile.gpu}) to {args.out}",
            file=sys.stderr,
        )
    else:
        print(profile.model_dump_json(indent=2))
    return EXIT_OK


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan profile`."""
    parser.description = (
        "Write the cost profile of --model: from hardware specs (--analytic, on --gpu for the cluster), "
        "measured on this machine (--device), or calibrated to a measured one (--calibrate, on --gpu for "
        "the cluster)."
    )
    add_cluster_options(parser)
    add_virtual_stages_option(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--analytic", action="store_true", help="build the profile from hardware specs and formulas")
    source.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="measure stage times, memory and collectives of --model on the local device(s) and fit "
        "them (needs torch: the runtime extra)",
    )
    source.add_argument(
        "--calibrate",
        metavar="MEASURED.json",
        help="fit the analytic model's hardware parameters to a --device profile, then write the profile "
        "of every scheme of --num-gpus x --gpu",
    )
    parser.add_argument(
        "--out", metavar="FILE", help="write to FILE (default: standard output; required with --device)"
    )
    measuring = parser.add_argument_group("measuring (--device)")
    measuring.add_argument(
        "--schemes",
        nargs="+",
        metavar="SCHEME",
        help="schemes to measure, e.g. '<1,1,1>' 2,1,1 (default: <1,1,1> <2,1,1> <1,1,2> <1,2,1>, those "
        "that fit the local ranks); one stage runs per process, TP x CP on that many local ranks",
    )
    measuring.add_argument(
        "--budget-s",
        type=positive_float,
        metavar="S",
        help="stop measuring after S seconds and write what was measured (default: 240)",
    )
    measuring.add_argument(
        "--token-counts",
        type=positive_int,
        nargs="+",
        metavar="T",
        help="micro-batch token counts, each measured in every length mix (long, short, mixed) "
        "(default: 128 256 512 768), then one sequence of twice the largest",
    )
    measuring.add_argument(
        "--mixes",
        nargs="+",
        choices=["long", "short", "mixed", "halves", "random"],
        metavar="MIX",
        help="length mixes per token count: long (one sequence), short (32-token sequences), mixed, "
        "halves (two of T/2), random (log-uniform lengths) (default: long short mixed halves)",
    )
    measuring.add_argument(
        "--repeats", type=positive_int, default=3, metavar="N", help="timed runs per micro-batch (default: %(default)s)"
    )
    measuring.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        metavar="N",
        help="intra-op threads per rank on CPU (default: %(default)s)",
    )
    add_progress_option(measuring)
    parser.set_defaults(handler=run_profile)


# ---------------------------------------------------------------------------------------------
# models and gpus: the catalogs
# ---------------------------------------------------------------------------------------------


def run_models(args: argparse.Namespace) -> int:
    """The model catalog: name, shape and parameter count (or the JSON list)."""
    models = list(read_models(args.models_file).values())
    if args.json:
        print(json.dumps([model.model_dump(mode="json") for model in models], indent=2))
        return EXIT_OK
    headers = ["model", "layers", "hidden", "ffn", "heads", "kv heads", "vocab", "params"]
    rows = [
        [
            model.name,
            f"{model.num_layers}",
            f"{model.hidden_size:,}",
            f"{model.ffn_hidden_size:,}",
            f"{model.num_heads}",
            f"{model.num_kv_heads}",
            f"{model.vocab_size:,}",
            _parameter_count(model.num_params),
        ]
        for model in models
    ]
    print(f"{len(models)} models\n")
    print_table(headers, rows)
    return EXIT_OK


def _parameter_count(num_params: int) -> str:
    """`8.03 B`, `6.2 M`."""
    return f"{num_params / 1e9:,.2f} B" if num_params >= 1e9 else f"{num_params / 1e6:,.1f} M"


def run_gpus(args: argparse.Namespace) -> int:
    """The GPU catalog: memory, BF16 peak and bandwidths (or the JSON list)."""
    gpus = list(read_gpus(args.gpus_file).values())
    if args.json:
        print(json.dumps([gpu.model_dump(mode="json") for gpu in gpus], indent=2))
        return EXIT_OK
    headers = ["gpu", "memory (GB)", "bf16 (TFLOP/s)", "HBM (GB/s)", "intra-node (GB/s)", "inter-node (GB/s)"]
    rows = [
        [
            gpu.name,
            f"{gpu.memory_bytes / 1e9:,.0f}",
            f"{gpu.peak_bf16_flops / 1e12:,.0f}",
            f"{gpu.hbm_bandwidth_bytes_per_s / 1e9:,.0f}",
            f"{gpu.intra_node_bandwidth_bytes_per_s / 1e9:,.0f}",
            f"{gpu.inter_node_bandwidth_bytes_per_s / 1e9:,.1f}",
        ]
        for gpu in gpus
    ]
    print(f"{len(gpus)} GPUs (bandwidths per GPU, one direction)\n")
    print_table(headers, rows)
    return EXIT_OK


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan models`."""
    parser.description = "List the catalog models (--model): the bundled ones and those of --models-file."
    add_catalog_file_option(parser, "model")
    add_json_option(parser, "print the entries as a JSON list instead of the table")
    parser.set_defaults(handler=run_models)


def add_gpus_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `hydraplan gpus`."""
    parser.description = "List the catalog GPUs (--gpu): the bundled ones and those of --gpus-file."
    add_catalog_file_option(parser, "GPU")
    add_json_option(parser, "print the entries as a JSON list instead of the table")
    parser.set_defaults(handler=run_gpus)


# ---------------------------------------------------------------------------------------------
# schema: the versioned formats as JSON Schema
# ---------------------------------------------------------------------------------------------


def run_schema(args: argparse.Namespace) -> int:
    """Print (or write) the JSON Schema of one format."""
    from hydraplan.planner.formats import json_schema

    text = json.dumps(json_schema(args.format), indent=2) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def add_schema_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Print the JSON Schema of a versioned hydraplan format (also in docs/schemas/)."
    parser.add_argument("format", choices=["plan", "profile", "request", "pool"], help="the format")
    parser.add_argument("--out", metavar="FILE", help="write to FILE (default: standard output)")
    parser.set_defaults(handler=run_schema)


ADD_ARGUMENTS = {
    "show": add_show_arguments,
    "schema": add_schema_arguments,
    "check": add_check_arguments,
    "schemes": add_schemes_arguments,
    "profile": add_profile_arguments,
    "models": add_models_arguments,
    "gpus": add_gpus_arguments,
}
