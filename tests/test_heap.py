"""release_free_heap: the pages that small freed blocks left resident go back to the OS (glibc), as they do after
summarising many ranks."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from distprof.analysis.summarize import heap
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


def _hugepage_flag_after(code: str, env_value: str | None) -> bool:
    """numpy's madvise-hugepage flag in a fresh process after `code` (its previous value, read by setting it)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if env_value is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = env_value
    probe = ("import numpy\nfrom numpy._core.multiarray import _set_madvise_hugepage as s\n"
             f"{code}\nprint(s(True))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1] == "True"


needs_numpy2 = pytest.mark.skipif(not hasattr(np, "_core"), reason="numpy 1.x keeps the switch elsewhere")


@needs_numpy2
def test_small_pages_turns_numpy_hugepages_off_after_import():
    code = "from distprof.analysis.summarize.heap import small_pages\nsmall_pages()"
    assert _hugepage_flag_after(code, "1") is True  # the user's choice is kept
    assert _hugepage_flag_after("pass", "1") is True  # the probe sees the flag on ...
    assert _hugepage_flag_after(code, None) is False  # ... and small_pages turns it off


@needs_numpy2
def test_the_command_line_runs_on_small_pages():
    code = ("import contextlib, io\nfrom distprof.cli import main\n"
            "with contextlib.redirect_stderr(io.StringIO()):\n    main(['report', '/nonexistent/run'])")
    assert _hugepage_flag_after(code, None) is False


class _Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_settle_freezes_what_lives_and_collects_what_died():
    import weakref

    from distprof.analysis.summarize.heap import long_lived, settle

    gc.collect()
    base = gc.get_freeze_count()  # 0, or what the interpreter froze itself (Python 3.12.1: 375 objects at startup)
    settle(force=True)  # outside long_lived: nothing frozen (a library leaves its caller's objects alone)
    assert gc.get_freeze_count() == base
    with long_lived():
        dead, alive = _Node(), _Node()
        dead_ref, alive_ref = weakref.ref(dead), weakref.ref(alive)
        del dead
        settle(force=True)
        assert dead_ref() is None  # garbage is collected before anything is frozen
        assert gc.get_freeze_count() > base
        with long_lived():  # nested: the outer one unfreezes
            pass
        assert gc.get_freeze_count() > base
        from distprof.analysis.summarize.heap import SETTLE_EVERY

        before = gc.get_freeze_count()
        more = [_Node() for _ in range(3)]
        for _ in range(SETTLE_EVERY - 1):
            settle()  # per item: once in SETTLE_EVERY calls
        for _ in range(SETTLE_EVERY):
            settle()
        assert gc.get_freeze_count() > before and len(more) == 3
        del alive
        gc.collect()
        assert alive_ref() is not None  # frozen: the collector's passes skip it ...
    assert gc.get_freeze_count() == 0
    release_free_heap()
    assert alive_ref() is None  # ... until the phase ends


def test_long_lived_unfreezes_on_error():
    from distprof.analysis.summarize.heap import long_lived, settle

    with pytest.raises(RuntimeError), long_lived():
        settle(force=True)
        raise RuntimeError("the report failed")
    assert gc.get_freeze_count() == 0


# ---- glibc keeps what the report frees ------------------------------------------------------------------------------
_REFAULT_PROBE = """
import contextlib, io, resource, sys
import numpy as np
from distprof.analysis.summarize.heap import keep_freed_memory, small_pages
small_pages()  # as the command line runs: 4 kB pages, one fault each
applied = False
if sys.argv[1] == "keep":
    applied = keep_freed_memory()
elif sys.argv[1] == "cli":
    from distprof.cli import main
    with contextlib.redirect_stderr(io.StringIO()):
        main(["report", "/nonexistent/run"])
a = np.ones(16 << 17)  # 16 MB: the first array of its size, as a report phase makes them
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(16 << 17)  # the next phase's array of the same size
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _refaults(mode: str, **env: str) -> tuple[bool, int]:
    """("keep": keep_freed_memory called, "cli": the command line run, "default": neither) -> (applied, the faults
    of the second 16 MB array)."""
    e = {k: v for k, v in os.environ.items() if k not in heap.MALLOC_ENV}
    out = subprocess.run([sys.executable, "-c", _REFAULT_PROBE, mode], capture_output=True, text=True, timeout=120,
                         env={**e, **env}, check=True)
    applied, faults = out.stdout.split()[-2:]
    return applied == "True", int(faults)


glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(os, "confstr")
                                or "glibc" not in (os.confstr("CS_GNU_LIBC_VERSION") or "").lower(),
                                reason="glibc's allocator only")


@glibc_only
def test_freed_arrays_are_reused_without_page_faults():
    """A 16 MB array freed and made again: by default glibc unmapped the first and faults every page of the second
    in (4,096 faults); kept, the second reuses the first's pages."""
    applied, kept = _refaults("keep")
    _, default = _refaults("default")
    assert applied and kept < 1000 < 3000 < default, (kept, default)


@glibc_only
def test_the_users_allocator_settings_are_left_alone():
    applied, faults = _refaults("keep", MALLOC_ARENA_MAX="2")
    assert not applied and faults > 3000


@glibc_only
def test_the_command_line_keeps_freed_memory():
    _, faults = _refaults("cli")
    assert faults < 1000, faults
