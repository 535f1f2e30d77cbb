"""Keep a training step's freed buffers in the process instead of handing them back to the system.

A step allocates and frees the same large arrays every time (logits blocks, activations,
gradients: 1-30 MiB each). glibc's allocator returns the free top of its heap to the system once
it exceeds the trim threshold (by default twice the largest block it served by mmap, so about
16 MiB here), and the next step faults the same pages in again: 1,000-2,000 page faults and 8-16 ms
of system time in a 100 ms step of the 5.5M full fine-tune (bench/CPU_NOTES.md). Raising the
mmap threshold to 32 MiB and the trim threshold to 128 MiB keeps those pages mapped between steps;
at most 128 MiB of free heap stays resident.

`keep_step_buffers()` sets this once per process, on Linux with glibc only (elsewhere it does
nothing), before the first training step. An environment that sets the allocator itself
(MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_) is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # blocks under this come from the heap and are reused
TRIM_THRESHOLD = 128 << 20  # free heap kept resident
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")

_done: bool | None = None  # None: not tried yet; then whether the thresholds were set


def keep_step_buffers() -> bool:
    """Set the allocator's thresholds (see the module docstring); True when they are in force."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if not sys.platform.startswith("linux") or any(os.environ.get(k) for k in USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries without mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not _done:
        log.info("the allocator's thresholds could not be set; freed step buffers go back to the system")
    return _done


__all__ = ["keep_step_buffers"]
