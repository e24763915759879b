"""Writing benchmark results: each script's full output (command, machine, load, every table) to its
own file under benchmarks/results/, and a short summary (key table + link to that file) to a marked
section of benchmarks/RESULTS.md.

A rerun replaces both sections in place; text outside the markers (findings written by hand, an
earlier run kept beside a later one) is left as it is.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

RESULTS_PATH = Path(__file__).with_name("RESULTS.md")
RESULTS_FOLDER = "results"  # the full outputs, beside the RESULTS file
HEADER = (
    "# Benchmark results\n\nEach section is rewritten by the script named in it; its full output is in the file it "
    "links to.\n"
)


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    """A GitHub-flavoured markdown table; floats keep the caller's formatting (pass strings)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def pivot_table(
    headers: list[str], rows: list[list[object]], keys: list[str], across: str, value: str, missing: str = "-"
) -> str:
    """The table `headers`/`rows` with one row per distinct `keys` and one `value` column per distinct
    `across` (in order of appearance), e.g. one row per length mix and one time column per method."""
    key_columns = [headers.index(key) for key in keys]
    across_column, value_column = headers.index(across), headers.index(value)
    columns = list(dict.fromkeys(str(row[across_column]) for row in rows))
    cells: dict[tuple[str, ...], dict[str, str]] = {}
    for row in rows:
        key = tuple(str(row[column]) for column in key_columns)
        cells.setdefault(key, {})[str(row[across_column])] = str(row[value_column])
    return markdown_table(
        [*keys, *(f"{column} {value}" for column in columns)],
        [[*key, *(found.get(column, missing) for column in columns)] for key, found in cells.items()],
    )


def environment_line(packages: tuple[str, ...] = ("numpy", "highspy", "ortools", "pulp")) -> str:
    """Machine and versions, for the reader to judge the numbers."""
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    cpu = _cpu_model()
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}; {cpu}; {_num_cores()} cores; "
        f"Python {platform.python_version()}; " + ", ".join(versions)
    )


def load_line() -> str:
    """The load averages when the results are written: other work on the machine skews timings."""
    try:
        return "{:.1f} / {:.1f} / {:.1f} (1, 5, 15 min) when written".format(*os.getloadavg())
    except (AttributeError, OSError):  # no load average on this platform
        return "not available on this platform"


def results_file(name: str, path: Path = RESULTS_PATH) -> Path:
    """The file holding the full output `name` for the RESULTS file `path`: results/<name>.md beside it."""
    return path.parent / RESULTS_FOLDER / f"{name}.md"


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation but `-` and `_` dropped,
    spaces as `-` (`mutation-checker+auth` -> `mutation-checkerauth`)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def write_result(
    name: str, command: str, body: str, summary: str, path: Path = RESULTS_PATH, file: str | None = None
) -> Path:
    """Write benchmark `name`: its full output (command, machine, load, `body`) to the section `name`
    of its results file, and its summary section (command, machine, a link to that section, then
    `summary`: the key table) to the RESULTS file `path`. `file` names the results file when it is
    not `name` (a mutation recheck goes beside its run). Returns the results file."""
    machine = environment_line()
    full_path = results_file(file or name, path)
    link = f"{full_path.relative_to(path.parent).as_posix()}#{anchor(name)}"
    full = (
        f"## {name}\n\nCommand: `{command}`\n\nMachine: {machine}\n\nLoad average: {load_line()}\n\n{body.rstrip()}\n"
    )
    short = (
        f"## {name}\n\n- Command: `{command}`\n- Machine: {machine}\n"
        f"- Full output: [{full_path.relative_to(path.parent).as_posix()}]({link})\n\n{summary.rstrip()}\n"
    )
    full_path.parent.mkdir(parents=True, exist_ok=True)
    back = Path(os.path.relpath(path, full_path.parent)).as_posix()
    replace_section(full_path, name, full, results_header(file or name, back))
    replace_section(path, name, short, HEADER)
    return full_path


def results_header(title: str, results_link: str) -> str:
    """The opening of a new results file, linking back to the summary."""
    return (
        f"# {title}\n\nFull output of the benchmark; its summary and the headline figures are in "
        f"[RESULTS.md]({results_link}). A rerun rewrites each marked section in place; text between the "
        "sections is written by hand.\n"
    )


def replace_section(path: Path, name: str, section: str, header: str) -> None:
    """Replace the marked section `name` of `path` with `section` (or append it; a new file starts
    with `header`), leaving the rest of the file as it is."""
    marked = f"<!-- {name}:start -->\n{section.rstrip()}\n<!-- {name}:end -->\n"
    text = path.read_text() if path.exists() else header
    pattern = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: marked, text)
    else:
        text = text.rstrip() + "\n\n" + marked
    path.write_text(text)


def command_line() -> str:
    return "python " + " ".join([sys.argv[0], *sys.argv[1:]])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _num_cores() -> int:
    try:
        return int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    except (OSError, ValueError):
        return os.cpu_count() or 1
