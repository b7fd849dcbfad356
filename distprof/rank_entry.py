"""How the launcher runs a rank: the script (``distprof.launch``), or the function of a process the script started with
torch.multiprocessing.spawn (``capture/spawned.py``), under that rank's profiler.

A module of its own, not ``distprof.launch``: the spawned processes find :func:`run_spawned` by its module's name,
and the launcher runs as ``__main__``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .capture.rundir import JobIdentity
    from .config import ProfileConfig


def profiled_call(prof, call: Callable[[], Any]) -> Any:
    """`call()` (the script; or a rank's function in a process the script spawned) under `prof`, started here;
    exceptions and SystemExit pass through after close(), which prints this rank's closing line (also when a signal
    ends the job: capture.signals). How the call ended is told to the profiler first: one that failed gets no hint
    about steps, and its run directory (if one was made) is marked failed in the status file."""
    prof.on_closed = _print_closing_line
    prof.start()
    try:
        return call()
    except SystemExit as e:
        if e.code not in (None, 0):
            prof.script_ended(f"exit code {e.code}" if isinstance(e.code, int) else "SystemExit")
        raise
    except BaseException as e:
        prof.script_ended(f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        prof.close()


def run_spawned(config: ProfileConfig, inherited: tuple[str, JobIdentity] | None, call: Callable[[], Any]) -> Any:
    """In a process the script started with torch.multiprocessing.spawn: `call()` (the script's function) as one of
    the job's ranks, in the run directory the launching process handed over (`inherited`: its run id and job)."""
    from .capture.profiler import RankProfiler
    from .source_summary import summarize_shard

    return profiled_call(RankProfiler(config, summarizer=summarize_shard, inherited_run=inherited), call)


def _print_closing_line(prof) -> None:
    """One line per rank on stderr: where the shards went, what was lost and why (rank 0 always speaks)."""
    line = prof.closing_line()
    if line:
        print(line, file=sys.stderr, flush=True)
