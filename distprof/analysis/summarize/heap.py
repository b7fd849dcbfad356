"""Freed memory given back to the OS between the report's phases.

Summarising leaves the heap full of small freed blocks: each rank's summary is many arrays of a few kilobytes, and
the joined tables that replace them are large arrays the allocator maps on their own. glibc keeps the small freed
blocks resident, so the cross-rank phase's large arrays come on top of them. ``malloc_trim(0)`` hands every wholly
free page back (at 1,024 LLM-shaped ranks: 178 MB of the 570 MB resident after summarising, and 100 MB off the
report's peak). Elsewhere than glibc the call is absent and this only collects the garbage.

``long_lived()`` and ``settle()``: while the report piles up objects that live until it ends (the shards' catalog,
every rank's summary, the joined run), Python's cyclic collector rescans all of them in each full pass, and runs
a full pass whenever they have grown by a quarter: at 16,384 ranks 18 passes took 7.3 s of rank 0's time. Inside
``long_lived()`` (the command line's report), ``settle()`` collects what is garbage and freezes what is alive
(``gc.freeze``; per item once in SETTLE_EVERY calls, at a phase's end always), so later passes skip it; leaving unfreezes them, and the next ``release_free_heap`` collects
whatever of them has died. Outside it (distprof as a library), ``settle()`` does nothing: freezing is the
process's, and a library must not leave its caller's objects frozen.

``small_pages()``: the distprof command line keeps numpy from asking for transparent huge pages. numpy advises
the kernel to back every array of 4 MB and more with 2 MB pages. Where a fresh 2 MB page is dear — the kernel
compacting memory to find one (``transparent_hugepage/defrag`` = ``madvise``, the usual default), or a VM whose free
2 MB blocks go back to the host (virtio-balloon free page reporting, as on this project's machines: each huge page
then costs ≈ 7 ms of host faults) — a page fault stalls for milliseconds, where 4 KB pages come from the guest's
own scattered free memory. The report fills each large array once and drops it soon after, so it gains little
from huge pages and pays for every stall (1,024 LLM-shaped ranks here: serial 10.3 s → 7.3 s, 4.2 s → 1.1 s of
system time; docs/scaling.md). ``NUMPY_MADVISE_HUGEPAGE`` set by the user is left as it is.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

__all__ = ["long_lived", "release_free_heap", "settle", "small_pages"]


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
    gc.collect()  # inside long_lived(), frozen objects are not looked at: they are collected after it
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


_long_lived = [False]


@contextmanager
def long_lived() -> Iterator[None]:
    """A phase whose objects mostly live to its end: ``settle()`` freezes them (see the module docstring); leaving
    unfreezes everything, so that the caller's next collection finds what has died meanwhile."""
    if _long_lived[0]:  # nested: the outer one unfreezes
        yield
        return
    _long_lived[0] = True
    try:
        yield
    finally:
        _long_lived[0] = False
        gc.unfreeze()


#: Per-item calls of settle() act once in this many (a collection costs ≈ 25 µs however little it finds: 16,384
#: ranks called it 24,579 times on MPI rank 0, 0.6 s); the automatic passes in between look at that many items' objects.
SETTLE_EVERY = 64
_calls = [0]


def settle(*, force: bool = False) -> None:
    """Inside ``long_lived()``: collect the garbage made since the last time, then freeze what is alive, so that the
    collector's later full passes skip it; per item (a rank, a shard) it acts once in SETTLE_EVERY calls, at a
    phase's end (`force`) always. A no-op elsewhere."""
    if not _long_lived[0]:
        return
    _calls[0] += 1
    if force or _calls[0] % SETTLE_EVERY == 0:
        gc.collect()  # only objects made since the last freeze are looked at: nothing dead is frozen
        gc.freeze()
