"""The C library's heap on a CPU rank: memory the cost model can promise.

A CPU rank's tensors come from glibc's `malloc`. By default it serves a block above the mmap
threshold (128 KiB at start) with its own mapping, handed back to the kernel when freed, but the
threshold then moves up to the size of each such block freed (up to 32 MiB): from then on blocks
of those sizes come from the heap, where freed space stays resident and is reused only by blocks
that fit in it. The process's resident peak then depends on the order in which earlier steps
freed blocks, not on the step itself: measured here, one shape's peak varies by 3-10% from step
to step (up to 14%) and sits 16-41% above what its tensors need
(benchmarks/results/cpu_allocator.md), so no fit of the profile can promise it.

`pin_mmap_threshold` fixes the threshold (glibc `mallopt(M_MMAP_THRESHOLD, 64 KiB)`, which also
turns the moving threshold off): every block above 64 KiB gets its own mapping, so the resident
size follows the bytes the rank's tensors hold, step after step (0-2.4% on the same shapes).
The price is a page fault per touched page of each new block: the tiny model's forward+backward
takes 1.25-1.8x the thread CPU time on this machine; it is measured in the profile's stage times
(the profiler pins it too), so plans price it. The profiler (`runtime.profiler.StageRunner`) and
the worker runtime (`runtime.worker.run_worker`) pin it on CPU ranks, so the memory a profile
promises is the memory the training process uses. CUDA ranks are untouched: their tensors come
from PyTorch's caching allocator, whose own peak is what the profiler measures there.

No library offers this (PyTorch has no CPU allocator setting; jemalloc or tcmalloc would be a
native dependency to preload before the process starts), hence the two `ctypes` calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["MMAP_THRESHOLD_BYTES", "malloc_trim", "pin_mmap_threshold", "pinned_threshold"]

# Blocks above this get their own mapping. benchmarks/results/cpu_allocator.md: 64 KiB, 256 KiB
# and 1 MiB measure alike on the tiny model (spread 0-2.4% on a shape's first steps); the smallest
# leaves the fewest blocks, and so the least of a step's peak, to the heap's history.
MMAP_THRESHOLD_BYTES = 64 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h

_pinned: int | None = None


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded once per process (`malloc_trim` runs at every metered step)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process; True when it is in force.

    Idempotent; False where the C library has no `mallopt` (not glibc) or refuses the value.
    """
    global _pinned
    if threshold <= 0:
        raise ValueError(f"mmap threshold {threshold}: must be > 0 bytes")
    if _pinned == threshold:
        return True
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None or mallopt(_M_MMAP_THRESHOLD, threshold) != 1:
        return False
    _pinned = threshold
    return True


def pinned_threshold() -> int | None:
    """The threshold `pin_mmap_threshold` set in this process, None when it has not."""
    return _pinned


def malloc_trim() -> None:
    """glibc's `malloc_trim(0)`: freed heap memory handed back to the kernel; nothing elsewhere."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)
