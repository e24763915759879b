"""Progress lines of long `hydraplan` commands, on standard error only.

A step prints `hydraplan: planning 1,234 sequences ... ` when it starts and `done in 2.1 s` (or
`failed after 0.3 s`) when it ends, on one line. Standard output never gets progress: `--json`
output stays parseable. `--progress` forces the lines, `--no-progress` silences them; by default
they appear when standard error is a terminal and the command is expected to take 2 s or more.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

PROG = "hydraplan"
PROGRESS_MIN_S = 2.0  # commands expected to take less print no progress by default


class Progress:
    """Writes step lines to standard error when enabled; does nothing otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_command(cls, requested: bool | None, expected_s: float) -> Progress:
        """`requested` is the `--progress` flag (None when absent); `expected_s` the likely run time."""
        if requested is not None:
            return cls(requested)
        return cls(expected_s >= PROGRESS_MIN_S and _stderr_is_terminal())

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        """Print `text ...` now and `done in X s` / `failed after X s` when the block ends."""
        if not self.enabled:
            yield
            return
        started_s = time.perf_counter()
        _write(f"{PROG}: {text} ... ")
        try:
            yield
        except BaseException:
            _write(f"failed after {time.perf_counter() - started_s:.1f} s\n")
            raise
        _write(f"done in {time.perf_counter() - started_s:.1f} s\n")


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def _write(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()
