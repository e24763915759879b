"""Progress lines of long `hydraplan` commands, on standard error only (drawn by `rich`).

A step reads `hydraplan: planning 1,234 sequences ... done in 2.1 s` (or `failed after 0.3 s`),
one line per step. On a terminal a spinner with the elapsed time stands in while the step runs
and the finished line replaces it; into a file or a pipe (`--progress`) the line's start is
written when the step starts and its end when it ends. Standard output never gets progress:
`--json` output stays parseable. `--progress` forces the lines, `--no-progress` silences them; by
default they appear when standard error is a terminal and the command is expected to take 2 s or
more.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

PROG = "hydraplan"
PROGRESS_MIN_S = 2.0  # commands expected to take less print no progress by default


def stderr_console():
    """A `rich` console on standard error as it is at call time: no markup, no highlighting, no
    wrapping (a line is never cut at 80 columns into a file), colour only on a terminal."""
    from rich.console import Console

    return Console(file=sys.stderr, markup=False, highlight=False, soft_wrap=True, emoji=False)


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


class Progress:
    """Writes step lines to standard error when enabled; does nothing otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_command(cls, requested: bool | None, expected_s: float) -> Progress:
        """`requested` is the `--progress` flag (None when absent); `expected_s` the likely run time."""
        if requested is not None:
            return cls(requested)
        return cls(expected_s >= PROGRESS_MIN_S and stderr_is_terminal())

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        """Show `text ...` while the block runs and end the line with `done in X s` / `failed after X s`."""
        if not self.enabled:
            yield
            return
        console = stderr_console()
        started_s = time.perf_counter()
        head = f"{PROG}: {text} ... "
        try:
            with _running(console, head):
                yield
        except BaseException:
            _end(console, head, f"failed after {time.perf_counter() - started_s:.1f} s")
            raise
        _end(console, head, f"done in {time.perf_counter() - started_s:.1f} s")


@contextmanager
def _running(console, head: str) -> Iterator[None]:
    """A transient spinner and elapsed time on a terminal; the bare line's start elsewhere."""
    if not console.is_terminal:
        console.print(head, end="")
        console.file.flush()
        yield
        return
    from rich.progress import Progress as Bar
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    # redirect_*=False: the command's own prints must stay on their streams (stdout stays stdout)
    with Bar(
        TextColumn("{task.description}", markup=False),
        SpinnerColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as bar:
        bar.add_task(head.rstrip(), total=None)
        yield


def _end(console, head: str, outcome: str) -> None:
    console.print(outcome if not console.is_terminal else head + outcome)
    console.file.flush()
