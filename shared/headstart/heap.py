"""Giving freed heap pages back to the system (glibc's `malloc_trim`).

glibc keeps freed memory in its arenas, and after the first large free it
raises its mmap threshold, so even large blocks come from the arenas: a
process that built big temporaries (loading and packing a model's weights,
parsing a tokenizer's JSON) keeps their pages resident after freeing them.
`malloc_trim(0)` returns every free page. The loaders call `trim_heap()` once
they are done, and an idle replica calls it now and then
(`services/engine/heap_trim.py`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from typing import Callable


@functools.cache
def libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def trim_heap() -> bool:
    """Collect cycles, then give free heap pages back; False where there is no `malloc_trim`."""
    gc.collect()
    trim = libc_malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
