"""The scheme table of a cost profile (`hydraplan schemes`), drawn by `api.render.tables`."""

from __future__ import annotations

from hydraplan.api.render.plan_text import model_on_gpu
from hydraplan.api.render.tables import print_table, table_text
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile

HEADERS = ["scheme", "GPUs", "a (s/tok^2)", "b (s/tok)", "c (s)", "fwd", "capacity tokens"]


def scheme_rows(profile: CostProfile) -> tuple[str, list[list[str]]]:
    """The heading line and one row per scheme (by GPUs per pipeline): coefficients in seconds,
    forward fraction, capacity in tokens. An interleaved scheme `<tp,pp,cp,v>` shows the
    coefficients of one micro-batch on one rank (its v chunks, their point-to-point traffic included)."""
    costs = ProfileCostModel(profile)
    schemes = sorted(costs.all_schemes(), key=lambda scheme: (scheme.num_gpus, scheme))
    rows = []
    for scheme in schemes:
        coefficients = costs.coefficients(scheme)
        rows.append(
            [
                str(scheme),
                str(scheme.num_gpus),
                f"{coefficients.a:.3e}",
                f"{coefficients.b:.3e}",
                f"{coefficients.c:.3e}",
                f"{coefficients.fwd_fraction:.2f}",
                f"{coefficients.capacity_tokens:,}",
            ]
        )
    heading = (
        f"cost profile: {profile.source}, {model_on_gpu(profile)}, {profile.num_layers} layers, {len(schemes)} schemes"
    )
    if any(scheme.v > 1 for scheme in schemes):
        heading += " (<tp,pp,cp,v>: v chunks per GPU, interleaved 1F1B; a, b, c of one rank's v chunks)"
    return heading, rows


def render_schemes(profile: CostProfile) -> str:
    """The heading and the table as plain text."""
    heading, rows = scheme_rows(profile)
    return f"{heading}\n\n{table_text(HEADERS, rows)}\n"


def print_schemes(profile: CostProfile) -> None:
    """The heading and the table on standard output (styled on a terminal)."""
    heading, rows = scheme_rows(profile)
    print(f"{heading}\n")
    print_table(HEADERS, rows)
