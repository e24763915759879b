"""Test hooks that break a rank on purpose, for the fault tests (like `RunSpec.inject_nan_step`).

A fault is `(kind, rank, step)`: "exit" ends that rank's process at the start of that step with
`os._exit(EXIT_CODE)` (no exception, no report, no goodbye to its peers: a crash or a kill);
"hang" makes that rank sleep for ever in place of its part of that step's gradient sync, so the
other ranks block in the sync's collective waiting for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

__all__ = ["EXIT_CODE", "FAULT_KINDS", "inject"]

FAULT_KINDS = ("exit", "hang")
EXIT_CODE = 17


def inject(faults: Sequence[tuple[str, int, int]], kind: str, rank: int, step: int) -> None:
    """Apply the fault of `kind` planned for (`rank`, `step`), if any."""
    for fault_kind, fault_rank, fault_step in faults:
        assert fault_kind in FAULT_KINDS, fault_kind
        if (fault_kind, fault_rank, fault_step) != (kind, rank, step):
            continue
        if kind == "exit":
            os._exit(EXIT_CODE)
        while True:  # "hang": never returns; the watchdog or the launcher's deadline ends the process
            time.sleep(3600)
