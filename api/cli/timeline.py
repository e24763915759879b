"""`--timeline FILE` and `--pipelines` of `hydraplan plan` and `hydraplan show`.

The file's suffix chooses the drawing: `.svg`, `.html` (the SVG plus the timeline data as JSON)
or `.png` (matplotlib, the `plots` extra). A bad suffix or a missing matplotlib is refused before
any planning starts, as one line naming the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hydraplan.api.cli.progress import PROG
from hydraplan.api.files import InputError

if TYPE_CHECKING:
    from hydraplan.planner.schemas import Plan

TIMELINE_FORMATS = {".svg": "svg", ".html": "html", ".htm": "html", ".png": "png"}
PIPELINE_CHOICES = ("auto", "grouped", "all")


def add_timeline_options(group: argparse._ActionsContainer) -> None:
    """`--timeline FILE` and `--pipelines auto|grouped|all`."""
    group.add_argument(
        "--timeline",
        metavar="FILE",
        help="draw the simulated 1F1B schedule of every pipeline to FILE: .svg, .html or .png (png needs "
        "matplotlib); with --compare the baselines' schedules too, on the same time axis",
    )
    group.add_argument(
        "--pipelines",
        choices=PIPELINE_CHOICES,
        default="auto",
        help="pipelines in the summary table and the timeline: grouped (the table one row per scheme, the "
        "timeline identical schedules once and the slowest 8 with a histogram of the rest), all (every "
        "pipeline), or auto (the table in full up to 16 pipelines, the timeline grouped) (default: %(default)s)",
    )


def timeline_format(path: str | None) -> str | None:
    """The drawing `--timeline path` asks for; refuses an unknown suffix or a PNG without matplotlib."""
    if path is None:
        return None
    kind = TIMELINE_FORMATS.get(Path(path).suffix.lower())
    if kind is None:
        suffix = Path(path).suffix or "(no suffix)"
        raise InputError(f"--timeline {path}: unknown format {suffix!r}; give .svg, .html or .png")
    if kind == "png":
        from hydraplan.api.render.png import MATPLOTLIB_MISSING

        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError(f"--timeline {path}: {MATPLOTLIB_MISSING}") from None
    return kind


def write_timeline(
    path: str, labelled_plans: Sequence[tuple[str, Plan]], pipelines: str, bounds: Sequence[bool]
) -> str:
    """Draw the plans' timelines into `path` (format from its suffix); returns the line saying so."""
    from hydraplan.api.render.svg import render_html, render_svg
    from hydraplan.api.render.timeline import timeline_document

    kind = timeline_format(path)
    try:
        document = timeline_document(labelled_plans, "all" if pipelines == "all" else "grouped", lower_bounds=bounds)
    except ValueError as exc:  # too many blocks to draw
        raise InputError(f"--timeline {path}: {exc}") from None
    if kind == "png":
        from hydraplan.api.render.png import write_png

        write_png(document, path)
    else:
        text = render_svg(document) if kind == "svg" else render_html(document)
        Path(path).write_text(text, encoding="utf-8")
    names = ", ".join(label for label, _ in labelled_plans)
    return f"{PROG}: wrote the timeline of {names} to {path}"
