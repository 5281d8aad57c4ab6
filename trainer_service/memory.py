"""Handing freed memory back to the operating system between steps (`trainer.release_memory`).

A step frees gigabytes of activations and gradients of a different shape every time; glibc's malloc
keeps much of it in its arenas (holes between live blocks), so a CPU trainer's resident set sits well
above what its tensors hold and its peak is that plus the next step's working set. `malloc_trim(0)`
returns every free page of every arena (glibc >= 2.8, madvise on the holes too), at the price of
faulting those pages in again in the next step. Measured in docs/benchmarks.md ("SmolLM2-135M addition").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger("jetrl.trainer.memory")


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        if name:
            return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        pass
    log.warning("trainer.release_memory: this C library has no malloc_trim; nothing is released")
    return None


def release_freed_memory() -> bool:
    """Return the allocator's free pages to the OS; True if anything was released."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
