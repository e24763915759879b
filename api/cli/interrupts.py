"""Ctrl-C however it surfaces, so that every command exits 130 on it, never with a traceback.

A SIGINT raises `KeyboardInterrupt` in the main thread. When it arrives while a C extension is
running Python code on the extension's behalf (numba's dispatcher unpickling a cached kernel, seen
in `hydraplan whatif`), the extension reports the failure as its own `SystemError`, with the
`KeyboardInterrupt` as the cause. `is_interrupt` recognises both; catch `INTERRUPTS` and re-raise
what is not one.
"""

from __future__ import annotations

INTERRUPTS = (KeyboardInterrupt, SystemError)


def is_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is a KeyboardInterrupt or was raised from one: its chain of causes and of
    contexts (an exception raised while handling another), unless a link suppressed its context
    (`raise ... from None`)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return False
