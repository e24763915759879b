"""The progress bar of a sweep on standard error: done / total, rate and time left.

On a terminal the bar redraws one line (`\\r`); otherwise (`--progress` into a file or a pipe) each
finished row prints one line. Rows already finished by an earlier run (`--resume`) count as done
but not in the rate.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

PROG = "hydraplan"
BAR_WIDTH = 24


class SweepProgress:
    def __init__(self, total: int, already_done: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = already_done
        self._already_done = already_done
        self.enabled = enabled
        self._stream = stream or sys.stderr
        self._started_s = time.perf_counter()
        self._redraw = enabled and _is_terminal(self._stream)

    def line(self) -> str:
        """`[#####-----] 12/27 rows, 1.9 rows/s, ~8 s left`."""
        filled = BAR_WIDTH * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        computed = self.done - self._already_done
        elapsed_s = time.perf_counter() - self._started_s
        rate = computed / elapsed_s if elapsed_s > 0 and computed else 0.0
        left = f"~{(self.total - self.done) / rate:.0f} s left" if rate else "time left unknown"
        if self.done >= self.total:
            left = f"done in {elapsed_s:.1f} s"
        return f"{PROG}: whatif [{bar}] {self.done}/{self.total} rows, {rate:.2f} rows/s, {left}"

    def start(self) -> None:
        if self.enabled:
            self._write(self.line())

    def advance(self) -> None:
        self.done += 1
        if self.enabled:
            self._write(self.line())

    def finish(self) -> None:
        if self._redraw:
            self._stream.write("\n")
            self._stream.flush()

    def _write(self, text: str) -> None:
        self._stream.write(("\r" + text) if self._redraw else text + "\n")
        self._stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
