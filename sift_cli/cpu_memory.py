"""Freed heap memory stays in a CPU process, so a forward's large intermediates reuse pages.

With glibc's defaults, a block freed at the top of the heap is given back to the system once more than a
few megabytes are free there, and the next forward touches the same amount of fresh memory: on the demo's
~2K-token SmolLM2 forward on a CPU, 0.3–1 million page faults and 0.5–1.8 s of system time per forward, in
both modes, more or fewer with the allocator's history (measured, docs/benchmarks.md). Raising the mmap
threshold to glibc's largest (32 MiB: intermediates up to that size come from the heap) and never trimming the
heap takes that to none after the first forward. The process keeps its peak heap until it exits.
"""

from __future__ import annotations

import ctypes
import functools
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc refuses more (half its largest heap)
TRIM_THRESHOLD = 2**31 - 1  # an int: "never" in practice


@functools.lru_cache(maxsize=None)
def keep_freed_memory() -> bool:
    """Set the process's allocator as above, once; False where the C library has no mallopt (not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
