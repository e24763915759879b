"""`hydraplan profile --device cpu|cuda` (measure and fit) and `--calibrate` (fit the analytic model's
hardware parameters to a measured profile and write one for a whole cluster).

torch is imported only once `--device` is chosen (`hydraplan.runtime.profiler`), so the rest of
the command line runs without it. A measured profile is rewritten after every scheme and once
more at the end, each time atomically (`save_profile`): Ctrl-C or the end of `--budget-s` leaves
a valid file holding everything measured so far, never a half-written one.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from hydraplan.api.cli.interrupts import INTERRUPTS, is_interrupt
from hydraplan.api.cli.progress import PROG
from hydraplan.planner.measurements import CollectiveSample, ProfileProvenance, StageSample
from hydraplan.planner.schemas import CostProfile, ModelSpec
from hydraplan.planner.scheme import ParallelScheme

EXIT_OK, EXIT_INTERRUPTED = 0, 130
DEFAULT_BUDGET_S = 240.0
DEFAULT_SCHEMES = ("<1,1,1>", "<2,1,1>", "<1,1,2>", "<1,2,1>")
MEMORY_RESERVE_FRACTION = 0.08
FP32_BYTES = 4
RUNTIME_MISSING = "--device needs torch: pip install 'hydraplan[runtime]' (torch==2.13.0, the CPU wheel)"


# ---------------------------------------------------------------------------------------------
# Progress: what is measured and the time left, on standard error
# ---------------------------------------------------------------------------------------------


class ProfileProgress:
    """One status line per measured micro-batch; rewritten in place on a terminal.

    Picklable (plain fields): the rank processes of a TP/CP scheme call it from rank 0.
    """

    def __init__(self, enabled: bool, deadline: float, terminal: bool) -> None:
        self.enabled, self.deadline, self.terminal = enabled, deadline, terminal

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        left_s = max(self.deadline - time.time(), 0.0)
        line = f"{PROG}: profiling {text}; {int(left_s // 60)}:{int(left_s % 60):02d} of the budget left"
        sys.stderr.write(f"\r\x1b[K{line}" if self.terminal else line + "\n")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled and self.terminal:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _progress(args: argparse.Namespace, deadline: float) -> ProfileProgress:
    try:
        terminal = sys.stderr.isatty()
    except (AttributeError, ValueError):
        terminal = False
    enabled = terminal if args.progress is None else args.progress
    return ProfileProgress(enabled, deadline, terminal)


# ---------------------------------------------------------------------------------------------
# Checking the request before any measurement
# ---------------------------------------------------------------------------------------------


def local_ranks(device: str) -> int:
    """Ranks this machine can run at once: CUDA devices, or CPU cores."""
    if device == "cuda":
        from hydraplan.runtime.profiler import cuda_device_count

        return cuda_device_count()
    return os.cpu_count() or 1


def check_device(device: str) -> None:
    """torch is installed and, for cuda, a CUDA device is visible."""
    try:
        from hydraplan.runtime.profiler import cuda_device_count
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        raise ValueError(RUNTIME_MISSING) from None
    if device == "cuda" and cuda_device_count() == 0:
        raise ValueError(
            "--device cuda: no CUDA device is available (torch.cuda.is_available() is False); use --device cpu"
        )


def requested_schemes(args: argparse.Namespace, model: ModelSpec) -> list[ParallelScheme]:
    """The schemes to measure: each must fit the local ranks and the model's shape."""
    ranks = local_ranks(args.device)
    texts = args.schemes or [
        text for text in DEFAULT_SCHEMES if ParallelScheme.parse(text).tp * ParallelScheme.parse(text).cp <= ranks
    ]
    schemes = []
    for text in texts:
        try:
            scheme = ParallelScheme.parse(text)
        except ValueError as exc:
            raise ValueError(f"--schemes: {exc}") from None
        width = scheme.tp * scheme.cp
        if width > ranks:
            raise ValueError(
                f"--schemes: {scheme} needs {width} local ranks, this machine has {ranks} "
                f"({'CUDA devices' if args.device == 'cuda' else 'CPU cores'}); measure the schemes that fit "
                "and plan larger ones with --calibrate"
            )
        if args.device == "cuda" and width > 1:
            raise ValueError(
                f"--schemes: {scheme}: --device cuda measures <1,pp,1> stages only; use --calibrate for TP/CP"
            )
        if model.num_layers % scheme.pp:
            raise ValueError(
                f"--schemes: {scheme}: pp {scheme.pp} does not divide the {model.num_layers} layers of {model.name}"
            )
        if model.num_heads % scheme.tp or model.num_kv_heads % scheme.tp:
            raise ValueError(f"--schemes: {scheme}: tp {scheme.tp} does not divide the heads of {model.name}")
        _check_stage_fits(args.device, model, scheme)
        if scheme not in schemes:
            schemes.append(scheme)
    return schemes


def _check_stage_fits(device: str, model: ModelSpec, scheme: ParallelScheme) -> None:
    """Refuse a stage whose fp32 weights and gradients alone take half the device's memory."""
    from hydraplan.cost_models.analytic import stage_params
    from hydraplan.runtime.profiler import device_memory_bytes

    stage_bytes = max(stage_params(model, scheme.pp)) / scheme.tp * 2 * FP32_BYTES
    memory = device_memory_bytes(device)
    if stage_bytes > memory / 2:
        raise ValueError(
            f"--schemes: {scheme}: a stage of {model.name} needs {stage_bytes / 2**30:.1f} GiB of fp32 weights and "
            f"gradients, more than half of the device's {memory / 2**30:.1f} GiB; measure a smaller --model "
            "(e.g. tiny) and plan this one with --calibrate"
        )


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


class Measurement:
    """The samples taken so far and the profile they give, written atomically after each scheme."""

    def __init__(self, args: argparse.Namespace, model: ModelSpec, provenance: ProfileProvenance) -> None:
        self.args, self.model, self.provenance = args, model, provenance
        self.samples: list[StageSample] = []
        self.collectives: list[CollectiveSample] = []

    def profile(self, interrupted: bool) -> CostProfile:
        from hydraplan.cost_models.fit import build_profiled_profile
        from hydraplan.runtime.profiler import device_memory_bytes

        provenance = self.provenance.model_copy(
            update={"samples": self.samples, "collectives": self.collectives, "interrupted": interrupted}
        )
        memory = device_memory_bytes(self.args.device)
        return build_profiled_profile(
            provenance,
            model=self.model.name,
            device_name=self.provenance.hardware.split(",")[0] if self.args.device == "cuda" else "cpu",
            num_layers=self.model.num_layers,
            memory_bytes=memory,
            memory_reserve_bytes=memory * MEMORY_RESERVE_FRACTION,
            model_spec=self.model,
        )

    def write(self, interrupted: bool) -> CostProfile | None:
        """Save the profile of what was measured; None while no scheme has enough samples."""
        from hydraplan.cost_models.profile_io import save_profile

        try:
            profile = self.profile(interrupted)
        except ValueError:
            return None
        save_profile(profile, self.args.out)
        return profile


def _stages(scheme: ParallelScheme) -> list[int]:
    """The last stage (LM head, the bottleneck) first, then the first (the most in flight)."""
    return sorted({scheme.pp - 1, 0}, reverse=True)


def measurement_jobs(schemes: list[ParallelScheme]) -> tuple[list[tuple[ParallelScheme, int]], dict[int, list]]:
    """(scheme, stage) jobs run in this process, and those run on local ranks grouped by rank count."""
    here: list[tuple[ParallelScheme, int]] = []
    on_ranks: dict[int, list] = {}
    for scheme in schemes:
        for stage in _stages(scheme):
            if scheme.gpus_per_stage == 1:
                here.append((scheme, stage))
            else:
                on_ranks.setdefault(scheme.gpus_per_stage, []).append((scheme, stage))
    return here, on_ranks


def _measure_all(measurement: Measurement, schemes, cfg, options, deadline: float, progress) -> None:
    """Every job, each with an equal share of the time left; a checkpoint write after each."""
    from hydraplan.runtime.profiler import profile_batches

    batches = profile_batches(options)
    here, on_ranks = measurement_jobs(schemes)
    jobs_left = len(here) + sum(len(jobs) for jobs in on_ranks.values())
    for scheme, stage in here:
        if time.time() >= deadline:
            return
        share = time.time() + (deadline - time.time()) / jobs_left
        _measure_here(measurement, scheme, stage, cfg, batches, options, share, progress)
        jobs_left -= 1
        measurement.write(interrupted=True)  # a checkpoint; the final write sets the flag right
    for num_ranks, jobs in sorted(on_ranks.items()):
        if time.time() >= deadline:
            return
        share = time.time() + (deadline - time.time()) * len(jobs) / jobs_left
        _measure_on_ranks(measurement, num_ranks, jobs, cfg, batches, options, share, progress)
        jobs_left -= len(jobs)
        measurement.write(interrupted=True)


def _measure_here(measurement, scheme, stage, cfg, batches, options, deadline, progress) -> None:
    from hydraplan.runtime.profiler import measure_stage

    def out_of_time() -> bool:
        return time.time() >= deadline

    for index, sample in enumerate(measure_stage(cfg, scheme.pp, stage, batches, options, out_of_time)):
        measurement.samples.append(sample)
        what = f"micro-batch {index + 1}/{len(batches)} ({sample.num_tokens} tokens, {sample.mix})"
        progress(f"{scheme} stage {stage}: {what}")


def _measure_on_ranks(measurement, num_ranks, jobs, cfg, batches, options, deadline, progress) -> None:
    from hydraplan.runtime.profiler_ranks import measure_on_ranks, read_samples

    keyed = [((scheme.tp, scheme.pp, scheme.cp), stage) for scheme, stage in jobs]
    wanted = not any(sample.ranks == num_ranks for sample in measurement.collectives)
    with tempfile.TemporaryDirectory(prefix="hydraplan-profile-") as folder:
        path = Path(folder) / "samples.jsonl"
        try:
            measure_on_ranks(cfg, num_ranks, keyed, batches, options, deadline, path, wanted, progress)
        finally:
            samples, collectives = read_samples(path)
            measurement.samples.extend(samples)
            measurement.collectives.extend(collectives)


def run_device_profile(args: argparse.Namespace) -> int:
    """Measure the schemes on the local device(s), fit, and write the profile (see the module)."""
    from hydraplan.api.files import catalog_model

    if not args.out:
        raise ValueError("--device: --out FILE is required (the profile is written as it is measured)")
    if args.budget_s is not None and args.budget_s <= 0:
        raise ValueError(f"--budget-s: a positive number of seconds is required, got {args.budget_s}")
    check_device(args.device)
    model = catalog_model(args.model, args.models_file)
    schemes = requested_schemes(args, model)
    from hydraplan.runtime.model import ModelConfig
    from hydraplan.runtime.profiler import MeasureOptions, device_description, profile_batches, torch_version

    options = MeasureOptions(device=args.device, num_threads=args.threads, repeats=args.repeats)
    if args.mixes:
        options = replace(options, mixes=tuple(dict.fromkeys(args.mixes)))
    if args.token_counts:
        options = replace(options, token_counts=tuple(sorted(set(args.token_counts))))
    cfg = ModelConfig.from_catalog(model.name, args.models_file)
    started = time.time()
    deadline = started + (args.budget_s or DEFAULT_BUDGET_S)
    progress = _progress(args, deadline)
    provenance = ProfileProvenance(
        device=args.device,
        hardware=device_description(args.device),
        torch_version=torch_version(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        model=model.name,
        num_threads=args.threads if args.device == "cpu" else None,
        dtype=str(options.dtype).removeprefix("torch."),
        budget_s=args.budget_s or DEFAULT_BUDGET_S,
        clock="thread" if args.device == "cpu" else "cuda",
    )
    measurement = Measurement(args, model, provenance)
    planned = sum(len(_stages(scheme)) for scheme in schemes) * len(profile_batches(options))
    stopped_by_user = False
    try:
        _measure_all(measurement, schemes, cfg, options, deadline, progress)
    except INTERRUPTS as exc:
        if not is_interrupt(exc):
            raise
        stopped_by_user = True
    progress.finish()
    partial = stopped_by_user or len(measurement.samples) < planned
    profile = measurement.write(partial)
    if profile is None:
        raise ValueError(
            f"{'interrupted' if stopped_by_user else 'out of budget'} before any scheme had 3 timed "
            f"micro-batches; nothing written to {args.out} (raise --budget-s)"
        )
    _report(profile, args.out, time.time() - started, partial)
    return EXIT_INTERRUPTED if stopped_by_user else EXIT_OK


def _report(profile: CostProfile, out: str, elapsed_s: float, interrupted: bool) -> None:
    fits = profile.provenance.fits if profile.provenance else []
    errors = ", ".join(f"<{f.tp},{f.pp},{f.cp}> {f.time_median_abs_error:.1%}" for f in fits)
    state = "partial (interrupted or out of budget) " if interrupted else ""
    longest = max((f.max_measured_length or 0 for f in fits), default=0)
    peaked = [f for f in fits if f.memory_fitted_to == "real_peak"]
    memory = "; memory fitted to the saved-activation bytes (no real-peak meter here): not a promise"
    if peaked:
        noise = max(f.memory_noise_bytes for f in peaked)
        memory = f"; memory fitted to the real peak with a {max(f.memory_margin for f in peaked):.0%} margin"
        memory += f" and {noise / 2**20:.2f} MiB of step noise above its envelope" if noise else " above its envelope"
    print(
        f"{PROG}: wrote {state}profiled profile of {len(profile.schemes)} schemes ({profile.model} on "
        f"{profile.gpu}) to {out} after {elapsed_s:.0f} s; fit error (median) {errors}{memory}; sequences up to "
        f"{longest:,} tokens measured, longer ones extrapolated (--token-counts measures further)",
        file=sys.stderr,
    )


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------


def run_calibrate(args: argparse.Namespace) -> int:
    """Fit the hardware parameters to `--calibrate FILE` and write the cluster's profile."""
    from hydraplan.api.files import InputError, catalog_gpu, catalog_model, read_profile
    from hydraplan.cost_models.calibrate import calibrated_profile
    from hydraplan.cost_models.profile_io import save_profile

    measured = read_profile(args.calibrate)
    if measured.provenance is None or not measured.provenance.samples:
        raise InputError(
            f"{args.calibrate}: a cost profile without measured samples (source {measured.source!r}); "
            "--calibrate needs the file `hydraplan profile --device` writes"
        )
    model = catalog_model(args.model, args.models_file)
    gpu = catalog_gpu(args.gpu, args.gpus_file)
    if measured.model is not None and measured.model != model.name:
        raise InputError(f"{args.calibrate}: measured model {measured.model!r}, but --model is {model.name!r}")
    profile = calibrated_profile(
        model, gpu, args.num_gpus, args.gpus_per_node, measured, measured_file=str(args.calibrate)
    )
    if args.out:
        save_profile(profile, args.out)
        error = profile.provenance.calibration_error or {}
        print(
            f"{PROG}: wrote calibrated profile of {len(profile.schemes)} schemes ({profile.model} on "
            f"{args.num_gpus} x {profile.gpu}) to {args.out}; calibration fit error median "
            f"{error.get('time_median_abs_error', 0):.1%}, p95 {error.get('time_p95_abs_error', 0):.1%}",
            file=sys.stderr,
        )
    else:
        print(profile.model_dump_json(indent=2))
    return EXIT_OK
