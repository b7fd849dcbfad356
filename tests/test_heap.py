"""release_free_heap: the pages that small freed blocks left resident go back to the OS (glibc), as they do after
summarising many ranks."""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest

from distprof.analysis.summarize.heap import _malloc_trim, release_free_heap


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


@pytest.mark.skipif(_malloc_trim() is None, reason="no glibc malloc_trim here")
def test_small_freed_blocks_are_given_back():
    blocks = [np.ones(1250) for _ in range(24_000)]  # 10 KB each, 240 MB: heap blocks, not mappings of their own
    kept = blocks[::12]  # one in twelve stays: the free runs between them are whole pages, held by the heap
    del blocks
    gc.collect()
    before = _rss_mb()
    release_free_heap()
    after = _rss_mb()
    assert after < before - 100, (before, after)
    assert len(kept) == 2000


def test_runs_anywhere():
    release_free_heap()  # no glibc: only the garbage collected, never an error
