"""The CLI's tables (`api.render.tables`, drawn by rich): plain ASCII off a terminal, styled on one."""

from __future__ import annotations

import io

from hydraplan.api.render.tables import print_table, table_text

HEADERS = ["model", "layers", "params"]
ROWS = [["llama3-8b", "32", "8.03 B"], ["tiny-[b]", "2", "6.2 M"]]  # brackets are text, not markup


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_text_off_a_terminal() -> None:
    assert table_text(HEADERS, ROWS) == (
        "model       layers   params\n"
        "---------- -------- -------\n"
        "llama3-8b       32   8.03 B\n"
        "tiny-[b]         2    6.2 M"
    )
    piped = io.StringIO()
    print_table(HEADERS, ROWS, file=piped)
    assert piped.getvalue() == table_text(HEADERS, ROWS) + "\n"  # no colour, no escape codes


def test_a_wide_table_is_never_folded_off_a_terminal() -> None:
    wide = [["x" * 150, "1", "2"]]
    assert len(table_text(HEADERS, wide).splitlines()) == 3


def test_styled_on_a_terminal() -> None:
    terminal = Terminal()
    print_table(HEADERS, ROWS, file=terminal)
    drawn = terminal.getvalue()
    assert "\x1b[1m" in drawn and "llama3-8b       32   8.03 B" in drawn and "tiny-[b]" in drawn
