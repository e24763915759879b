"""The CLI's terminal tables, drawn by `rich.table`.

On a terminal a table has a bold header over a rule and fits the window; anywhere else (a pipe,
a file, a test's captured output) it is plain ASCII with no colour and no wrapping: the header,
a rule of dashes under each column, one line per row with trailing spaces trimmed. The first
columns (names) are left-aligned, those from `right_from` on (numbers) right-aligned.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from typing import TextIO

# No edges, no verticals: a rule of dashes under the header (rich.box.Box: 8 rows of 4 characters,
# left / horizontal / divider / right of the top, head, head rule, mid, row, foot rule, foot, bottom).
_PLAIN_BOX_ROWS = ["    ", "    ", " -  ", "    ", "    ", "    ", "    ", "    "]
NO_WRAP_WIDTH = 100_000  # off a terminal a row is never folded


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right_from: int, terminal: bool):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        box=box.SIMPLE_HEAD if terminal else box.Box("\n".join(_PLAIN_BOX_ROWS) + "\n", ascii=True),
        show_edge=False,
        pad_edge=False,
        header_style="bold" if terminal else "",
        padding=(0, 1),
    )
    for column, header in enumerate(headers):
        table.add_column(Text(header), justify="right" if column >= right_from else "left", no_wrap=not terminal)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def table_text(headers: Sequence[str], rows: Sequence[Sequence[str]], right_from: int = 1) -> str:
    """The plain rendering (no colour, no wrapping, trailing spaces trimmed), without a final newline."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=NO_WRAP_WIDTH, no_color=True, force_terminal=False, highlight=False)
    console.print(_table(headers, rows, right_from, terminal=False))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right_from: int = 1, file: TextIO | None = None
) -> None:
    """Print the table to `file` (standard output): styled on a terminal, `table_text` elsewhere."""
    from rich.console import Console

    stream = file or sys.stdout
    console = Console(file=stream, highlight=False, markup=False, emoji=False)
    if console.is_terminal:
        console.print(_table(headers, rows, right_from, terminal=True))
    else:
        print(table_text(headers, rows, right_from), file=stream)
