"""`hydraplan run` without a plan file: rank 0 plans each step, locally or through `--server`.

`hydraplan run --server URL [--token T] --nproc N --steps K` opens a planning session on the
service (its cluster: `--nproc` GPUs, `--gpus-per-node`; its costs: `--profile`, sent inline;
its options: `--plan-time-limit-s`, `--oversize`), before any rank starts: a refusal is one line,
exit 2. Then rank 0 takes each step's batch (`SyntheticLengths`: `--batch-sequences` lengths up
to `--max-length`, by `--data-seed` and the step; with `--data`, `DocumentLengths`: the next
`--batch-sequences` documents), asks the session for its plan, broadcasts it,
and every rank runs it; strategies switch as the service decides. Without `--server`, the same
loop plans each step with the local planner (`LocalPlanner`) in rank 0. The session is deleted
when the run ends. After each step rank 0 hands the step's measured stage times, gradient-sync
times and (on CUDA) peak memory to the planner, the session's or the local one's refit, so the
next steps are planned with the refitted, versioned profile (`--no-feedback`: not). See
`api/cli/run_planning.py` and `runtime/plan_feed.py`.
"""

from __future__ import annotations

import argparse
from typing import Any

from hydraplan.api.cli.args import non_negative_int, positive_int, time_limit
from hydraplan.api.cli.run_planning import (
    DocumentLengths,
    LocalPlanner,
    SessionPlanner,
    SyntheticLengths,
    close_session,
    open_session,
)
from hydraplan.api.files import read_profile

__all__ = ["OnlinePlanning", "add_online_arguments", "add_server_argument", "online_planning"]


def add_server_argument(source: argparse._MutuallyExclusiveGroup) -> None:
    """`--server`, in the plan-source group (beside --plan and --plans)."""
    source.add_argument(
        "--server",
        metavar="URL",
        help="plan each step through a session of this `hydraplan serve` (default without "
        "--plan/--plans: plan each step locally)",
    )


def add_online_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of planning each step."""
    group = parser.add_argument_group("planning each step (--server, or no --plan/--plans)")
    group.add_argument("--token", help="the service's bearer token (HYDRAPLAN_API_TOKEN of the server)")
    group.add_argument(
        "--profile", metavar="FILE", help="cost profile to plan with (default: the bundled tiny CPU profile)"
    )
    group.add_argument(
        "--gpus-per-node", type=positive_int, metavar="N", help="GPUs per node (default: all --nproc ranks)"
    )
    group.add_argument(
        "--batch-sequences",
        type=positive_int,
        default=16,
        metavar="N",
        help="sequences per step (with --data: the next N documents; default: 16)",
    )
    group.add_argument(
        "--max-length",
        type=positive_int,
        default=512,
        metavar="TOKENS",
        help="longest synthetic sequence; lengths are log-uniform in [1, TOKENS] (default: 512)",
    )
    group.add_argument(
        "--plan-time-limit-s",
        type=time_limit,
        default=0.5,
        metavar="SECONDS|auto",
        help="planning budget per step, or auto: half of the step-time floor, in [0.5, 60] s (default: 0.5)",
    )
    group.add_argument(
        "--oversize",
        choices=("error", "split", "drop"),
        default="error",
        help="sequences longer than every capacity: refuse the step (the default: nothing is trained "
        "shorter than the user's data without asking), cut into chunks (reported), or drop",
    )
    group.add_argument(
        "--no-feedback",
        action="store_true",
        help="do not send each step's measurements to the planner (default: send them; the profile is refitted "
        "online and each plan names its version)",
    )
    group.add_argument(
        "--plan-retries",
        type=non_negative_int,
        default=5,
        metavar="N",
        help="503 answers waited out (their Retry-After, at most 30 s each) before giving up (default: 5)",
    )


class OnlinePlanning:
    """The planner and batch source of a run, and the session to close when it ends."""

    def __init__(
        self, planner, next_lengths: SyntheticLengths, session: SessionPlanner | None, cfg, feedback: bool = True
    ) -> None:
        self.planner, self.next_lengths, self.session = planner, next_lengths, session
        self.cfg = cfg  # the runtime's config of the profile's model
        self.feedback = feedback  # rank 0 hands each step's measurements to the planner

    def read_documents(self, path: str, start: int, num_sequences: int) -> None:
        """Take each step's batch from the token directory (`--data`) instead of synthetic lengths."""
        self.next_lengths = DocumentLengths(path, start, num_sequences)

    def spec_fields(self) -> dict[str, Any]:
        return {"planner": self.planner, "next_lengths": self.next_lengths, "post_measurements": self.feedback}

    def close(self) -> None:
        if self.session is not None:
            close_session(self.session)


def online_planning(args: argparse.Namespace) -> OnlinePlanning:
    """Checks the flags, opens the session (`--server`); a refusal raises `ValueError` (one line)."""
    if args.nproc is None:
        raise ValueError("--nproc: required when each step is planned (no --plan/--plans)")
    profile = _profile(args)
    cfg = _check_buildable(profile, args)
    gpus_per_node = args.gpus_per_node or args.nproc
    options = {"time_limit_s": args.plan_time_limit_s, "seed": args.data_seed, "oversize": args.oversize}
    lengths = SyntheticLengths(args.batch_sequences, args.max_length, args.data_seed)
    if args.server is None:
        from hydraplan.planner.schemas import SolverOptions

        planner = LocalPlanner(
            profile.model_dump_json(), args.nproc, gpus_per_node, SolverOptions(**options).model_dump_json()
        )
        return OnlinePlanning(planner, lengths, None, cfg, not args.no_feedback)
    unopened = SessionPlanner(args.server, "", token=args.token, max_retries=args.plan_retries)
    body = {
        "num_gpus": args.nproc,
        "gpus_per_node": gpus_per_node,
        "profile": profile.model_dump(mode="json"),
        "options": options,
    }
    session = open_session(unopened, body)
    return OnlinePlanning(session, lengths, session, cfg, not args.no_feedback)


def _check_buildable(profile, args: argparse.Namespace):
    """The runtime can build the profile's model with its layer count (else no plan would run)."""
    from hydraplan.cost_models.catalog import CatalogError
    from hydraplan.runtime.model import ModelConfig

    where = f"--profile {args.profile}" if args.profile else "the bundled profile"
    try:
        cfg = ModelConfig.from_catalog(profile.model, args.models_file)
    except CatalogError as exc:
        raise ValueError(f"{where}: its model {profile.model!r} cannot be built: {exc}") from None
    if cfg.num_layers != profile.num_layers:
        raise ValueError(
            f"{where}: model {profile.model!r} has {cfg.num_layers} layers, the profile {profile.num_layers}"
        )
    return cfg


def _profile(args: argparse.Namespace):
    if args.profile is not None:
        return read_profile(args.profile)
    from hydraplan.cost_models.profile_io import bundled_profile

    return bundled_profile()
