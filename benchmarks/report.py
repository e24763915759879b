"""Writing benchmark tables into benchmarks/RESULTS.md, one marked section per benchmark."""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

RESULTS_PATH = Path(__file__).with_name("RESULTS.md")
HEADER = "# Benchmark results\n\nEach section is rewritten by the script named in it.\n"


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    """A GitHub-flavoured markdown table; floats keep the caller's formatting (pass strings)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


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


def write_section(name: str, command: str, body: str, path: Path = RESULTS_PATH) -> None:
    """Replace (or append) the section `name` of RESULTS.md with the command, machine and body."""
    section = (
        f"<!-- {name}:start -->\n## {name}\n\nCommand: `{command}`\n\n"
        f"Machine: {environment_line()}\n\n{body.rstrip()}\n<!-- {name}:end -->\n"
    )
    text = path.read_text() if path.exists() else HEADER
    pattern = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip() + "\n\n" + section
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
        import os

        return os.cpu_count() or 1
