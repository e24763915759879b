"""The progress bar of a sweep on standard error: done / total, rate and time left (drawn by `rich`).

On a terminal `rich.progress` redraws one bar in place (it clears what it overwrites: no stray
characters when a line shortens); otherwise (`--progress` into a file or a pipe) each finished row
prints one line, `hydraplan: whatif [######------------------] 1/4 rows, 0.00 rows/s, time left
unknown`. Rows already finished by an earlier run (`--resume`) count as done but not in the rate.
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
        self._bar = None  # the live rich bar, on a terminal, between start() and finish()
        self._task = None

    def rate(self) -> float:
        """Rows computed by this run per second (0 before the first)."""
        computed = self.done - self._already_done
        elapsed_s = time.perf_counter() - self._started_s
        return computed / elapsed_s if elapsed_s > 0 and computed else 0.0

    def left(self) -> str:
        """`~8 s left`, `time left unknown`, or `done in 3.2 s` once every row is done."""
        if self.done >= self.total:
            return f"done in {time.perf_counter() - self._started_s:.1f} s"
        rate = self.rate()
        return f"~{(self.total - self.done) / rate:.0f} s left" if rate else "time left unknown"

    def line(self) -> str:
        """`[#####-----] 12/27 rows, 1.9 rows/s, ~8 s left` (the line written into a file or a pipe)."""
        filled = BAR_WIDTH * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        return f"{PROG}: whatif [{bar}] {self.done}/{self.total} rows, {self.rate():.2f} rows/s, {self.left()}"

    def start(self) -> None:
        if not self.enabled:
            return
        if _is_terminal(self._stream):
            self._bar = _terminal_bar(self._stream)
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total, completed=self.done, stats=self._stats())
        else:
            self._print(self.line())

    def advance(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, stats=self._stats())
        else:
            self._print(self.line())

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, stats=self._stats())
            self._bar.stop()  # leaves the final bar on its own line
            self._bar = None

    def _stats(self) -> str:
        return f"{self.rate():.2f} rows/s, {self.left()}"

    def _print(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()


def _terminal_bar(stream: TextIO):
    """`hydraplan: whatif ━━━━━━━━━━━━━━━━━━━━━━━━ 12/27 rows, 1.9 rows/s, ~8 s left`."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(file=stream, markup=False, highlight=False, emoji=False)
    return Progress(
        TextColumn(f"{PROG}: whatif", markup=False),
        BarColumn(bar_width=BAR_WIDTH),
        MofNCompleteColumn(),
        TextColumn("rows, {task.fields[stats]}", markup=False),
        console=console,
        redirect_stdout=False,  # the sweep's own output stays on its stream
        redirect_stderr=False,
        refresh_per_second=4,
    )


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
