"""The pinned C heap of CPU ranks (`runtime.cpu_allocator`): freed tensors leave the process.

Each case runs in a fresh interpreter: the pin is process-wide and cannot be undone.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from hydraplan.runtime import cpu_allocator

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the pin is glibc's mallopt; elsewhere pin_mmap_threshold returns False",
)

# Allocates 4 MiB, touches every page, frees it; twice. glibc's moving threshold rises to 4 MiB
# when the first block (served by its own mapping) is freed, so the second comes from the heap and
# stays resident after it is freed; with the threshold pinned both are mappings, handed back.
_SCRIPT = """
import ctypes, json, sys
from hydraplan.runtime.cpu_allocator import pin_mmap_threshold, pinned_threshold
pinned = pin_mmap_threshold() if sys.argv[1] == "pin" else False
def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
size = 4 * 2**20
kept = []
for _ in range(2):
    before = rss()
    block = bytearray(size)
    ctypes.memset((ctypes.c_char * size).from_buffer(block), 1, size)
    del block
    kept.append(rss() - before)
print(json.dumps({"pinned": pinned, "threshold": pinned_threshold(), "kept": kept}))
"""


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


@glibc
def test_pinned_heap_hands_freed_blocks_back():
    result = _run("pin")
    assert result["pinned"] is True
    assert result["threshold"] == cpu_allocator.MMAP_THRESHOLD_BYTES
    assert all(kept < 2**20 for kept in result["kept"]), result


@glibc
def test_without_the_pin_a_freed_block_stays_resident():
    """The control: what the pin prevents happens here (else the test above proves nothing)."""
    result = _run("none")
    assert result["pinned"] is False and result["threshold"] is None
    assert result["kept"][1] >= 3 * 2**20, result


def test_threshold_must_be_positive():
    for bad in (0, -65536):
        with pytest.raises(ValueError, match=str(bad)):
            cpu_allocator.pin_mmap_threshold(bad)


def test_malloc_trim_runs_without_a_c_library(monkeypatch):
    monkeypatch.setattr(cpu_allocator, "_libc", lambda: None)
    cpu_allocator.malloc_trim()  # no error where there is nothing to trim
    assert cpu_allocator.pin_mmap_threshold(12345) is False
