"""Freed memory given back to the OS between the report's phases.

Summarising leaves the heap full of small freed blocks: each rank's summary is many arrays of a few kilobytes, and
the joined tables that replace them are large arrays the allocator maps on their own. glibc keeps the small freed
blocks resident, so the cross-rank phase's large arrays come on top of them. ``malloc_trim(0)`` hands every wholly
free page back (at 1,024 LLM-shaped ranks: 178 MB of the 570 MB resident after summarising, and 100 MB off the
report's peak). Elsewhere than glibc the call is absent and this only collects the garbage.

``small_pages()``: the distprof command line keeps numpy from asking for transparent huge pages. numpy advises
the kernel to back every array of 4 MB and more with 2 MB pages; where the kernel compacts memory to find them on
the spot (``/sys/kernel/mm/transparent_hugepage/defrag`` = ``madvise``, the usual default), a page fault can stall
for milliseconds. The report fills each large array once and drops it soon after, so it gains little from huge
pages and pays for every stall (1,024 LLM-shaped ranks on this project's 2-core VM: serial 10.6 s → 7.4 s, 4.2 s →
1.1 s of system time; docs/scaling.md). ``NUMPY_MADVISE_HUGEPAGE`` set by the user is left as it is.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from functools import cache

__all__ = ["release_free_heap", "small_pages"]


@cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc; musl and others have none
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_heap() -> None:
    """Collect the garbage (summaries hold reference cycles), then give the wholly free heap pages back to the OS."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


#: numpy's switch (read when numpy is imported): 0 = never advise huge pages.
HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"


def small_pages() -> None:
    """Keep numpy from advising transparent huge pages in this process (see the module docstring), unless the user
    set ``NUMPY_MADVISE_HUGEPAGE``. Before numpy is imported the variable does it; after, numpy's own switch."""
    if HUGEPAGE_ENV in os.environ:
        return
    os.environ[HUGEPAGE_ENV] = "0"  # numpy reads it when imported; MPI helpers and child processes inherit it
    if "numpy" not in sys.modules:
        return
    try:
        from numpy._core.multiarray import _set_madvise_hugepage  # numpy >= 2
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage  # numpy 1.x
        except ImportError:
            return
    _set_madvise_hugepage(False)
