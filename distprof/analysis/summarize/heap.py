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

``keep_freed_memory()``: the command line also has glibc keep the memory the report frees for its next arrays.
By default glibc maps each block of 128 kB and more on its own and unmaps it when freed (the threshold then rises
to the freed block's size), and hands the heap's free top back once it exceeds twice that: a report that builds
and drops arrays of a few MB phase after phase takes every one of their pages from the kernel again, a page fault
each (at 1,024 LLM-shaped ranks 558 k faults, 1.0 s of system time). With blocks up to 32 MB (glibc's largest
threshold) taken from the heap and its free top kept, 261 k faults and 0.55 s; the peak does not move (the freed
memory is what the next phase reuses; ``release_free_heap`` still hands it back between summarising and the
cross-rank phase). A process whose user set glibc's malloc variables (``MALLOC_*_``, ``GLIBC_TUNABLES``) is left as
it is.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

__all__ = ["keep_freed_memory", "long_lived", "release_free_heap", "settle", "small_pages"]


@cache
def _glibc(name: str, *argtypes: type) -> Any:
    """glibc's function `name` (returning an int), or None elsewhere (musl and others have neither call used here)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
    return fn


def _malloc_trim():
    return _glibc("malloc_trim", ctypes.c_size_t)


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


#: glibc's mallopt parameters, and the values the command line sets (the largest mmap threshold glibc accepts on
#: 64-bit, half its heap size; a trim threshold above any heap the report grows, as an int).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 2**31 - 1
#: Set by the user: glibc's allocator is then theirs to tune.
MALLOC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
              "MALLOC_ARENA_MAX", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Have glibc reuse the memory the report frees instead of unmapping it (see the module docstring); True when
    set, False elsewhere than glibc or when the user tunes the allocator."""
    mallopt = _glibc("mallopt", ctypes.c_int, ctypes.c_int)
    if mallopt is None or any(k in os.environ for k in MALLOC_ENV):
        return False
    # the mmap threshold first: setting either stops glibc moving them itself
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


_long_lived = [False]


@contextmanager
def long_lived() -> Iterator[None]:
    """A phase whose objects mostly live to its end: ``settle()`` freezes them (see the module docstring); leaving
    unfreezes everything, so that the caller's next collection finds what has died meanwhile (what Python 3.12 froze
    itself at startup too: gc cannot unfreeze only some objects, and only the command line enters this)."""
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
