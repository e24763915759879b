"""The scheme table of a cost profile (`hydraplan schemes`), drawn by `api.render.tables`."""

from __future__ import annotations

from hydraplan.api.render.plan_text import model_on_gpu
from hydraplan.api.render.tables import print_table, table_text
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile

HEADERS = ["scheme", "GPUs", "a (s/tok^2)", "b (s/tok)", "c (s)", "fwd", "capacity tokens"]
# Extra columns of a measured profile: where its measurements stop and what its memory is fitted to.
MEASURED_HEADERS = ["longest measured", "memory fitted to"]


def measured_range(profile: CostProfile) -> dict[tuple[int, int, int], tuple[int, str]]:
    """Per measured scheme: the longest sequence timed (beyond it stage times and memory are
    extrapolated) and what the memory model was fitted to; empty for an analytic profile."""
    provenance = profile.provenance
    if provenance is None or not provenance.samples:
        return {}
    longest: dict[tuple[int, int, int], int] = {}
    for sample in provenance.samples:
        if not sample.oom and sample.time_s is not None:
            longest[sample.key] = max(longest.get(sample.key, 0), max(sample.lengths))
    fitted = {(fit.tp, fit.pp, fit.cp): fit for fit in provenance.fits}
    result = {}
    for key, length in longest.items():
        fit = fitted.get(key)
        kind = fit.memory_fitted_to if fit is not None and fit.memory_fitted_to else "saved_tensors"
        if kind == "real_peak":
            kind = f"real peak +{fit.memory_margin:.0%}"
            if fit.memory_noise_bytes:
                kind += f" +{fit.memory_noise_bytes / 2**20:.2f} MiB"
        result[key] = (length, kind.replace("_", " "))
    return result


def scheme_rows(profile: CostProfile) -> tuple[str, list[list[str]]]:
    """The heading line and one row per scheme (by GPUs per pipeline): coefficients in seconds,
    forward fraction, capacity in tokens. An interleaved scheme `<tp,pp,cp,v>` shows the
    coefficients of one micro-batch on one rank (its v chunks, their point-to-point traffic included)."""
    costs = ProfileCostModel(profile)
    schemes = sorted(costs.all_schemes(), key=lambda scheme: (scheme.num_gpus, scheme))
    measured = measured_range(profile)
    rows = []
    for scheme in schemes:
        coefficients = costs.coefficients(scheme)
        extra = []
        if measured:
            length, kind = measured.get((scheme.tp, scheme.pp, scheme.cp), (0, "-"))
            extra = [f"{length:,}" if length else "-", kind]
        rows.append(
            [
                str(scheme),
                str(scheme.num_gpus),
                f"{coefficients.a:.3e}",
                f"{coefficients.b:.3e}",
                f"{coefficients.c:.3e}",
                f"{coefficients.fwd_fraction:.2f}",
                f"{coefficients.capacity_tokens:,}",
                *extra,
            ]
        )
    heading = (
        f"cost profile: {profile.source}, {model_on_gpu(profile)}, {profile.num_layers} layers, {len(schemes)} schemes"
    )
    if any(scheme.v > 1 for scheme in schemes):
        heading += " (<tp,pp,cp,v>: v chunks per GPU, interleaved 1F1B; a, b, c of one rank's v chunks)"
    return heading, rows


def _headers_and_note(profile: CostProfile) -> tuple[list[str], str]:
    if not measured_range(profile):
        return HEADERS, ""
    note = (
        "\nStage times and memory of sequences longer than `longest measured` are extrapolated from the "
        "fit; the capacity may lie far beyond it.\n"
    )
    return HEADERS + MEASURED_HEADERS, note


def render_schemes(profile: CostProfile) -> str:
    """The heading and the table as plain text."""
    heading, rows = scheme_rows(profile)
    headers, note = _headers_and_note(profile)
    return f"{heading}\n\n{table_text(headers, rows)}\n{note}"


def print_schemes(profile: CostProfile) -> None:
    """The heading and the table on standard output (styled on a terminal)."""
    heading, rows = scheme_rows(profile)
    headers, note = _headers_and_note(profile)
    print(f"{heading}\n")
    print_table(headers, rows)
    if note:
        print(note, end="")
