"""How the launcher runs a rank: the script (``distprof.launch``), the function of a process the script started with
torch.multiprocessing.spawn, or the target of one it started with multiprocessing.Process (``capture/spawned.py``),
under that rank's profiler.

A module of its own, not ``distprof.launch``: the started processes find :func:`run_spawned` and :func:`run_started`
by their module's name, and the launcher runs as ``__main__``.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from .capture.rundir import JobIdentity
    from .capture.spawned import Handoff
    from .config import ProfileConfig

log = logging.getLogger(__name__)


def profiled_call(prof, call: Callable[[], Any]) -> Any:
    """`call()` (the script; or a rank's function in a process the script spawned) under `prof`, started here;
    exceptions and SystemExit pass through after close(), which prints this rank's closing line (also when a signal
    ends the job: capture.signals). How the call ended is told to the profiler first: one that failed gets no hint
    about steps, and its run directory (if one was made) is marked failed in the status file."""
    prof.on_closed = _print_closing_line
    prof.start()
    with _closed_after(lambda: prof):
        return call()


@contextmanager
def _closed_after(profiler: Callable[[], Any]) -> Iterator[None]:
    """The body's end told to the profiler `profiler()` returns then (None: there is none), which is then closed:
    a non-zero SystemExit or an exception is the script's failure; both pass through."""
    try:
        yield
    except SystemExit as e:
        prof = profiler()
        if prof is not None and e.code not in (None, 0):
            prof.script_ended(f"exit code {e.code}" if isinstance(e.code, int) else "SystemExit")
        raise
    except BaseException as e:
        prof = profiler()
        if prof is not None:
            prof.script_ended(f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        prof = profiler()
        if prof is not None:
            prof.close()


def run_spawned(config: ProfileConfig, inherited: tuple[str, JobIdentity] | None, call: Callable[[], Any]) -> Any:
    """In a process the script started with torch.multiprocessing.spawn: `call()` (the script's function) as one of
    the job's ranks, in the run directory the launching process handed over (`inherited`: its run id and job)."""
    from .capture.profiler import RankProfiler
    from .source_summary import summarize_shard

    return profiled_call(RankProfiler(config, summarizer=summarize_shard, inherited_run=inherited), call)


def run_started(config: ProfileConfig, handoff: Handoff, call: Callable[[], Any]) -> Any:
    """In a process the script started with multiprocessing.Process: `call()` (its target) as it is, profiled as a
    rank from the moment it makes a default process group — inside that registration, where every rank of the job
    is, a profiler starts and agrees the run as torchrun workers' do. Its rank 0 takes the launcher's run directory
    when the launcher has not (``spawned.Handoff``). A process that makes no group is not profiled: it may be any
    helper the script starts."""
    from .capture import groups

    started: list = []

    def on_default_group(pg, store) -> None:
        if started:  # a second default group (the first destroyed): the profiler that runs records on
            return
        try:
            started.append(_rank_profiler(config, handoff, pg))
            started[0].start()  # closed below whatever happens from here
            started[0].started_in_group(pg, store)
        except Exception as e:  # noqa: BLE001 -- the group forms as torch made it; this rank goes unprofiled
            log.warning("distprof: a process the script started made a process group, but could not be profiled "
                        "(%s: %s); training goes on", type(e).__name__, e)

    groups.set_default_group_listener(on_default_group)
    groups.install()
    try:
        with _closed_after(lambda: started[0] if started else None):
            return call()
    finally:
        if not started:
            groups.set_default_group_listener(None)


def _rank_profiler(config: ProfileConfig, handoff: Handoff, pg):
    """The profiler of a started process that has just made its default group `pg` (not started yet)."""
    from .capture import setup as run_setup
    from .capture.profiler import RankProfiler
    from .source_summary import summarize_shard

    run_setup.expect_spawned_ranks(pg.size())  # a rank of several from here on: nothing is claimed before agreeing
    inherited = handoff.inherited if pg.rank() == 0 and handoff.inherited and handoff.take("rank 0") else None
    prof = RankProfiler(config, summarizer=summarize_shard, inherited_run=inherited)
    prof.on_closed = _print_closing_line
    return prof


def _print_closing_line(prof) -> None:
    """One line per rank on stderr: where the shards went, what was lost and why (rank 0 always speaks)."""
    line = prof.closing_line()
    if line:
        print(line, file=sys.stderr, flush=True)
